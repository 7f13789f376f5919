//! Human output: sizes, the volume table, the family tree and pool info,
//! and the one way a command prints to stdout (say, print_with, print_json).
//! Everything here renders to a `String` or a writer, so it can be tested
//! without running a command.

pub mod archive;
pub mod space;

use std::collections::{BTreeMap, HashSet};
use std::io::{self, BufWriter, ErrorKind, Write};

use anyhow::{Context, Result};
use grove_store::{CheckReport, DiffReport, PoolInfo, VolumeInfo};

/// Binary units, each 1024 times the one before.
const SIZE_UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
const SIZE_UNIT_STEP: u64 = 1024;

/// Tree connectors: a child with later siblings, and the last child.
const CHILD: &str = "├── ";
const LAST_CHILD: &str = "└── ";

/// Shown where a volume has no parent.
const NO_PARENT: &str = "-";

/// A size for people: "0 B", "512 B", "1.0 KiB", "1.5 GiB".
pub fn format_size(bytes: u64) -> String {
    if bytes < SIZE_UNIT_STEP {
        return format!("{bytes} B");
    }
    let mut unit = 0;
    let mut scaled = bytes as f64;
    while scaled >= SIZE_UNIT_STEP as f64 && unit + 1 < SIZE_UNITS.len() {
        scaled /= SIZE_UNIT_STEP as f64;
        unit += 1;
    }
    // 1023.96 KiB would print as "1024.0 KiB": say "1.0 MiB" instead.
    if format!("{scaled:.1}") == "1024.0" && unit + 1 < SIZE_UNITS.len() {
        scaled /= SIZE_UNIT_STEP as f64;
        unit += 1;
    }
    format!("{scaled:.1} {}", SIZE_UNITS[unit])
}

/// The `grove list` table: one row per volume, sizes right-aligned.
pub fn write_volume_table(out: &mut impl Write, volumes: &[VolumeInfo]) -> io::Result<()> {
    let header = [
        "NAME",
        "KIND",
        "PARENT",
        "SIZE",
        "REFERENCED",
        "UNIQUE",
        "WRITTEN",
    ];
    let rows: Vec<[String; 7]> = volumes
        .iter()
        .map(|v| {
            [
                v.summary.name.clone(),
                v.summary.kind.as_str().to_string(),
                v.summary
                    .parent
                    .clone()
                    .unwrap_or_else(|| NO_PARENT.to_string()),
                format_size(v.summary.size_bytes),
                format_size(v.summary.referenced_bytes),
                format_size(v.unique_bytes),
                format_size(v.written_bytes),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header = header.map(str::to_string);
    for row in std::iter::once(&header).chain(&rows) {
        let line = format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}  {:>w4$}  {:>w5$}  {:>w6$}",
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            row[5],
            row[6],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3],
            w4 = widths[4],
            w5 = widths[5],
            w6 = widths[6],
        );
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// The `grove tree` drawing: roots (volumes without a parent) and the
/// children under each, both in id order, joined with box-drawing lines.
pub fn write_volume_tree(out: &mut impl Write, volumes: &[VolumeInfo]) -> io::Result<()> {
    let mut by_id: Vec<&VolumeInfo> = volumes.iter().collect();
    by_id.sort_by_key(|v| v.summary.id);
    let names: HashSet<&str> = by_id.iter().map(|v| v.summary.name.as_str()).collect();
    let mut children: BTreeMap<&str, Vec<&VolumeInfo>> = BTreeMap::new();
    let mut roots = Vec::new();
    for volume in &by_id {
        match volume.summary.parent.as_deref() {
            Some(parent) if names.contains(parent) => {
                children.entry(parent).or_default().push(volume)
            }
            _ => roots.push(*volume),
        }
    }
    let mut printed = HashSet::new();
    for root in roots {
        write_subtree(out, root, &children, &mut printed)?;
    }
    // A parent cycle would leave volumes unreachable from any root; the
    // engine never makes one, but the listing must still show every volume.
    for volume in by_id {
        if !printed.contains(volume.summary.name.as_str()) {
            write_subtree(out, volume, &children, &mut printed)?;
        }
    }
    Ok(())
}

/// Draws one root and everything under it. Iterative, so a chain of
/// thousands of snapshots cannot overflow the stack.
fn write_subtree<'a>(
    out: &mut impl Write,
    root: &'a VolumeInfo,
    children: &BTreeMap<&str, Vec<&'a VolumeInfo>>,
    printed: &mut HashSet<&'a str>,
) -> io::Result<()> {
    // Each entry: the volume, what its line starts with, and its connector
    // to its parent ("" for the root).
    let mut stack: Vec<(&VolumeInfo, String, &str)> = vec![(root, String::new(), "")];
    while let Some((volume, line_prefix, connector)) = stack.pop() {
        if !printed.insert(volume.summary.name.as_str()) {
            continue;
        }
        writeln!(out, "{line_prefix}{connector}{}", tree_label(volume))?;
        let kids_prefix = format!("{line_prefix}{}", child_indent(connector));
        let kids = children
            .get(volume.summary.name.as_str())
            .map_or(&[][..], |k| k);
        // Pushed in reverse so that the first child is drawn first.
        for (index, kid) in kids.iter().enumerate().rev() {
            let last = index + 1 == kids.len();
            let kid_connector = if last { LAST_CHILD } else { CHILD };
            stack.push((kid, kids_prefix.clone(), kid_connector));
        }
    }
    Ok(())
}

/// What a volume's descendants carry below its connector: a line going on
/// down if it has later siblings, blank space if it is the last one.
fn child_indent(connector: &str) -> &'static str {
    match connector {
        CHILD => "│   ",
        LAST_CHILD => "    ",
        _ => "",
    }
}

fn tree_label(volume: &VolumeInfo) -> String {
    format!(
        "{} ({}, {}, referenced {}, unique {}, written {})",
        volume.summary.name,
        volume.summary.kind.as_str(),
        format_size(volume.summary.size_bytes),
        format_size(volume.summary.referenced_bytes),
        format_size(volume.unique_bytes),
        format_size(volume.written_bytes),
    )
}

/// `grove diff` for people: one "offset  length  what" line per extent.
pub fn write_diff(out: &mut impl Write, report: &DiffReport) -> io::Result<()> {
    let mut data_bytes = 0;
    let mut zero_bytes = 0;
    writeln!(out, "{:>14}  {:>14}  WHAT", "OFFSET", "LENGTH")?;
    for extent in &report.extents {
        let what = if extent.data { "data" } else { "zero" };
        writeln!(
            out,
            "{:>14}  {:>14}  {what}",
            extent.offset_bytes, extent.length_bytes
        )?;
        if extent.data {
            data_bytes += extent.length_bytes;
        } else {
            zero_bytes += extent.length_bytes;
        }
    }
    let extents = match report.extents.len() {
        1 => "1 extent".to_string(),
        n => format!("{n} extents"),
    };
    writeln!(
        out,
        "{} differs from {}{}: {} of new data, {} now zero, in {extents}{}",
        report.newer,
        report.base,
        if report.base_removed {
            " (a removed snapshot)"
        } else {
            ""
        },
        format_size(data_bytes),
        format_size(zero_bytes),
        size_change(report)
    )
}

/// "; its size grew from 1.0 GiB to 2.0 GiB", or nothing when the sizes match.
fn size_change(report: &DiffReport) -> String {
    let (base, newer) = (report.base_size_bytes, report.newer_size_bytes);
    if base == newer {
        return String::new();
    }
    let how = if newer > base { "grew" } else { "shrank" };
    format!(
        "; its size {how} from {} to {}",
        format_size(base),
        format_size(newer)
    )
}

/// `grove info` for people: one "field  value" line each.
pub fn write_pool_info(out: &mut impl Write, info: &PoolInfo) -> io::Result<()> {
    let capacity = info.capacity_bytes.map_or_else(
        || "none (grows while the file system has room)".to_string(),
        format_size,
    );
    let lines = [
        ("pool", info.path.clone()),
        ("format version", info.format_version.to_string()),
        ("block size", format_size(u64::from(info.block_size_bytes))),
        ("volumes", info.volume_count.to_string()),
        ("store size", format_size(info.store_bytes)),
        ("used", format_size(info.used_bytes)),
        (
            "allocated on host",
            info.store_allocated_bytes
                .map_or_else(|| "unknown".to_string(), format_size),
        ),
        ("referenced", format_size(info.referenced_bytes)),
        ("metadata", format_size(info.metadata_bytes)),
        ("pending free", format_size(info.pending_free_bytes)),
        ("free", format_size(info.free_bytes)),
        ("capacity", capacity),
    ];
    let mut lines = lines.to_vec();
    if let Some(space) = &info.space {
        // "used" is already there, as a size.
        lines.extend(
            space::space_lines(space)
                .into_iter()
                .filter(|(field, _)| *field != "used"),
        );
    }
    space::write_fields(out, &lines)
}

/// The report of `grove check`: what was checked and how fast, then every
/// error, warning and repair, what the check after a repair still found,
/// and the verdict: the same findings `--json` carries.
pub fn write_check_report(
    out: &mut impl Write,
    report: &CheckReport,
    after_repair: Option<&CheckReport>,
) -> io::Result<()> {
    writeln!(
        out,
        "checked {} blocks in {:.2} s ({} blocks/s)",
        report.blocks_checked,
        report.elapsed_ms as f64 / 1000.0,
        report.blocks_per_second()
    )?;
    for error in &report.errors {
        writeln!(out, "error: {error}")?;
    }
    for warning in &report.warnings {
        writeln!(out, "warning: {warning}")?;
    }
    for repair in &report.repaired {
        writeln!(out, "repaired: {repair}")?;
    }
    // What the check after the repair still found, as --json has it too.
    if let Some(after) = after_repair {
        for error in &after.errors {
            writeln!(out, "after repair, error: {error}")?;
        }
        for warning in &after.warnings {
            writeln!(out, "after repair, warning: {warning}")?;
        }
    }
    let verdict = after_repair.unwrap_or(report);
    let when = if after_repair.is_some() {
        "after repair, "
    } else {
        ""
    };
    match (verdict.errors.len(), verdict.warnings.len()) {
        (0, 0) => writeln!(out, "{when}the pool is clean"),
        (0, warnings) if verdict.loses_space() => writeln!(
            out,
            "{when}no errors, but space is lost: {} leaked blocks, {} over-counted ({warnings} warnings)",
            verdict.leaked_blocks, verdict.over_counted_blocks
        ),
        (0, warnings) => writeln!(out, "{when}no errors ({warnings} warnings)"),
        (errors, _) => writeln!(out, "{when}{errors} errors"),
    }
}

/// JSON on one line: what scripts grep and parse (pipe through `jq` to read it).
pub fn print_json(value: &impl serde::Serialize) -> Result<()> {
    print_with(|out| {
        serde_json::to_writer(&mut *out, value).map_err(io::Error::from)?;
        writeln!(out)
    })
}

/// Runs `render` on buffered stdout. A reader that went away early
/// (`grove list | head`) is not an error.
pub fn print_with(
    render: impl FnOnce(&mut BufWriter<io::StdoutLock>) -> io::Result<()>,
) -> Result<()> {
    let mut out = BufWriter::new(io::stdout().lock());
    match render(&mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == ErrorKind::BrokenPipe => Ok(()),
        result => result.context("cannot write to standard output"),
    }
}

/// Prints one line of a command's report on stdout. Unlike println!, a
/// closed stdout is an error rather than a panic, and a reader that went
/// away early is not an error (the change itself is already done).
pub fn say(line: std::fmt::Arguments) -> Result<()> {
    print_with(|out| writeln!(out, "{line}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use grove_store::{VolumeKind, VolumeSummary};

    #[test]
    fn sizes() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1024), "1.0 KiB");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(1 << 30), "1.0 GiB");
        assert_eq!(format_size((1 << 20) - 1), "1.0 MiB");
        assert_eq!(format_size(10 << 40), "10.0 TiB");
        assert_eq!(format_size(u64::MAX), "16.0 EiB");
    }

    fn volume(id: u64, name: &str, kind: VolumeKind, parent: Option<&str>) -> VolumeInfo {
        VolumeInfo {
            summary: VolumeSummary {
                id,
                name: name.to_string(),
                kind,
                read_only: kind == VolumeKind::Snapshot,
                parent: parent.map(str::to_string),
                size_bytes: 1 << 30,
                referenced_bytes: 4096,
                created_unix_secs: 0,
                rank: 0,
            },
            unique_bytes: 0,
            written_bytes: 0,
            created_generation: 1,
            guid: String::new(),
        }
    }

    #[test]
    fn tree_nesting() {
        let volumes = [
            volume(1, "a", VolumeKind::Volume, None),
            volume(2, "a@1", VolumeKind::Snapshot, Some("a")),
            volume(3, "b", VolumeKind::Volume, None),
            volume(4, "c", VolumeKind::Clone, Some("a@1")),
            volume(5, "a@2", VolumeKind::Snapshot, Some("a")),
        ];
        let mut out = Vec::new();
        write_volume_tree(&mut out, &volumes).unwrap();
        let text = String::from_utf8(out).unwrap();
        let tail = " (KIND, 1.0 GiB, referenced 4.0 KiB, unique 0 B, written 0 B)";
        let expected = ["a V", "├── a@1 S", "│   └── c C", "└── a@2 S", "b V"]
            .map(|line| {
                let (name, kind) = line.rsplit_once(' ').unwrap();
                let kind = match kind {
                    "V" => "volume",
                    "S" => "snapshot",
                    _ => "clone",
                };
                format!("{name}{}\n", tail.replace("KIND", kind))
            })
            .concat();
        assert_eq!(text, expected);
    }

    #[test]
    fn check_report_shows_what_remains_after_repair() {
        let report = CheckReport {
            warnings: vec!["3 blocks are allocated but used by nothing".into()],
            repaired: vec!["freed 3 leaked blocks".into()],
            leaked_blocks: 3,
            ..CheckReport::default()
        };
        let after = CheckReport {
            errors: vec!["volume \"v\": damaged node".into()],
            warnings: vec!["superblock slot 1 is torn".into()],
            ..CheckReport::default()
        };
        let mut out = Vec::new();
        write_check_report(&mut out, &report, Some(&after)).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(
            lines,
            [
                "warning: 3 blocks are allocated but used by nothing",
                "repaired: freed 3 leaked blocks",
                "after repair, error: volume \"v\": damaged node",
                "after repair, warning: superblock slot 1 is torn",
                "after repair, 1 errors",
            ]
        );
        let mut out = Vec::new();
        write_check_report(&mut out, &report, None).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.ends_with(
                "no errors, but space is lost: 3 leaked blocks, 0 over-counted (1 warnings)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn table_aligns() {
        let volumes = [
            volume(1, "disk", VolumeKind::Volume, None),
            volume(2, "disk@monday", VolumeKind::Snapshot, Some("disk")),
        ];
        let mut out = Vec::new();
        write_volume_table(&mut out, &volumes).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("NAME         KIND      PARENT"));
        assert!(lines[1].starts_with("disk         volume    -"));
        assert!(lines[2].starts_with("disk@monday  snapshot  disk"));
        assert!(
            lines[2].ends_with("1.0 GiB     4.0 KiB     0 B      0 B"),
            "{text}"
        );
    }
}
