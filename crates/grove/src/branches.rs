//! The branch commands: `grove rebuild`, `grove scrub` and `grove branch
//! fail|add|restripe`, here or through the daemon holding the pool (the
//! `BranchAdmin` trait, branch_pool.rs), and how their reports print,
//! `grove info`'s branch section among them.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

use crate::branch_pool::{degraded_line, BranchAdmin, BranchReport, RebuildSummary, ScrubSummary};
use crate::cli::BranchCommand;
use crate::output::{format_size, print_json, print_with, say};

pub fn rebuild(branches: &dyn BranchAdmin, branch: &str, to: PathBuf, force: bool) -> Result<()> {
    let to = std::path::absolute(&to).unwrap_or(to);
    let summary = branches.rebuild_branch(branch, &to, force)?;
    say(format_args!("{}", rebuilt_line(&summary)))
}

pub fn scrub(dir: &Path, branches: &dyn BranchAdmin, repair: bool, json: bool) -> Result<()> {
    let summary = branches.scrub_branches(repair)?;
    if json {
        print_json(&summary)?;
    } else {
        print_with(|out| write_scrub(out, &summary))?;
    }
    let left = summary.errors_left();
    if left > 0 {
        bail!(
            "scrub found {left} stripes with errors{} in pool {}",
            if repair {
                " it could not repair"
            } else {
                " (`grove scrub --repair` writes them again from what is right)"
            },
            dir.display()
        );
    }
    Ok(())
}

/// `grove branch fail|add|restripe`.
pub fn run(dir: &Path, branches: &dyn BranchAdmin, command: BranchCommand) -> Result<()> {
    match command {
        BranchCommand::Fail { label } => {
            let report = branches.fail_branch(&label)?;
            say(format_args!(
                "branch {label} is out of service; {}",
                degraded_line(dir, &report).unwrap_or_else(|| "the pool is degraded".into())
            ))
        }
        BranchCommand::Add { dirs, restripe } => add(branches, &dirs, restripe),
        BranchCommand::Restripe => restripe_and_say(branches),
    }
}

fn add(branches: &dyn BranchAdmin, dirs: &[PathBuf], restripe: bool) -> Result<()> {
    let report = branches.add_branches(dirs)?;
    let added: Vec<String> = report.branches[report.branches.len() - dirs.len()..]
        .iter()
        .map(|b| format!("{} ({})", b.label, b.dir))
        .collect();
    say(format_args!(
        "added {}: the pool has {} branches; new space is laid over all of them",
        added.join(", "),
        report.branches.len()
    ))?;
    if restripe {
        restripe_and_say(branches)?;
    } else if report.segments.len() > 1 {
        say(format_args!(
            "what is stored stays where it is: `grove branch restripe` spreads it over every branch"
        ))?;
    }
    Ok(())
}

/// `grove branch restripe`, and `grove branch add --restripe` after the add.
fn restripe_and_say(branches: &dyn BranchAdmin) -> Result<()> {
    let summary = branches.restripe_branches()?;
    if summary.segments == 0 {
        return say(format_args!(
            "nothing to restripe: everything stored lies over every branch"
        ));
    }
    say(format_args!(
        "restriped {} segment(s): {} copied; everything stored lies over every branch",
        summary.segments,
        format_size(summary.bytes_copied)
    ))
}

/// The branch section of `grove info`.
pub fn write_report(out: &mut impl Write, report: &BranchReport) -> io::Result<()> {
    writeln!(
        out,
        "branches           {} over {}, stripe unit {}{}",
        report.level,
        report.branches.len(),
        format_size(report.stripe_unit_bytes),
        if report.degraded { ": DEGRADED" } else { "" }
    )?;
    let width = report
        .branches
        .iter()
        .map(|b| b.label.len())
        .max()
        .unwrap_or(0);
    for branch in &report.branches {
        writeln!(
            out,
            "  {:<width$}  {:<10}  {}",
            branch.label, branch.health, branch.dir
        )?;
    }
    if report.segments.len() > 1 {
        let narrow: Vec<String> = report
            .segments
            .iter()
            .filter(|s| (s.branches as usize) < report.branches.len())
            .map(|s| format!("from {} over {}", format_size(s.start_bytes), s.branches))
            .collect();
        if !narrow.is_empty() {
            writeln!(
                out,
                "segments           {} ({} over fewer branches: {}); `grove branch restripe` spreads them",
                report.segments.len(),
                narrow.len(),
                narrow.join(", ")
            )?;
        }
    }
    if let Some(done) = report.restripe_done_bytes {
        writeln!(
            out,
            "restripe           unfinished, {} copied (`grove branch restripe` resumes it)",
            format_size(done)
        )?;
    }
    if let Some(job) = &report.job {
        writeln!(
            out,
            "running            {}: {} of {} {}",
            job.what, job.done, job.total, job.unit
        )?;
    }
    Ok(())
}

/// The rebuild's summary line.
pub fn rebuilt_line(summary: &RebuildSummary) -> String {
    format!(
        "rebuilt branch {} into {}: {} stripes, {} written and read back",
        summary.report.label,
        summary.dir,
        summary.report.stripes,
        format_size(summary.report.bytes_written)
    )
}

pub fn write_scrub(out: &mut impl Write, summary: &ScrubSummary) -> io::Result<()> {
    let report = &summary.report;
    writeln!(
        out,
        "scrubbed {} stripes: {} with errors{}",
        report.stripes,
        report.stripes_with_errors,
        if summary.repair {
            format!(
                ", {} units repaired, {} stripes unrepairable",
                report.repaired_units, report.unrepairable_stripes
            )
        } else {
            String::new()
        }
    )?;
    for (label, units) in &report.bad_units {
        writeln!(out, "  branch {label}: {units} bad units")?;
    }
    if report.units_without_sum > 0 {
        writeln!(
            out,
            "  {} units without a checksum were judged by their copies and parity alone",
            report.units_without_sum
        )?;
    }
    Ok(())
}
