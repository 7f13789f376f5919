//! The configuration: rules in order, and one-line errors naming the rule.

use grove_raif::config::{Config, FileFacts};
use grove_raif::Level;

const BRANCHES: &str = r#"
[[branch]]
label = "a"
path = "/b/a"
[[branch]]
label = "b"
path = "/b/b"
[[branch]]
label = "c"
path = "/b/c"
[[branch]]
label = "d"
path = "/b/d"
"#;

fn config(rest: &str) -> Result<Config, String> {
    Config::parse(&format!("{BRANCHES}{rest}")).map_err(|e| e.to_string())
}

fn facts(path: &str, uid: u32, size_bytes: u64) -> FileFacts<'_> {
    FileFacts {
        path,
        uid,
        gid: 0,
        size_bytes,
    }
}

#[test]
fn rules_apply_in_order_and_the_default_last() {
    let config = config(
        r#"
[[rule]]
name = "media"
glob = ["video/**"]
extension = ["mp3"]
level = "raif5"
branches = ["b", "c", "d"]
stripe_unit = "256K"
[[rule]]
name = "alice"
owner = 1000
level = "raif1"
branches = ["a", "b"]
[[rule]]
name = "big"
min_size = "1M"
level = "raif0"
[default]
level = "raif6"
stripe_unit = 4096
"#,
    )
    .unwrap();
    let rule = |path, uid, size| config.rule_for(&facts(path, uid, size)).name.clone();
    assert_eq!(rule("music/x.MP3", 1000, 0), "media");
    assert_eq!(rule("video/a/b.bin", 0, 0), "media");
    assert_eq!(rule("notes.txt", 1000, 0), "alice");
    assert_eq!(rule("notes.txt", 0, 2 << 20), "big");
    assert_eq!(rule("notes.txt", 0, 10), "default");
    let media = &config.rules[0];
    assert_eq!(
        (media.level, media.branches.clone(), media.stripe_unit_bytes),
        (Level::Raif5, vec![1, 2, 3], 256 << 10)
    );
    assert_eq!(config.rules[3].stripe_unit_bytes, 4096);
    assert_eq!(config.rules[2].branches, vec![0, 1, 2, 3]);
}

#[test]
fn bad_configs_get_one_line_naming_the_rule() {
    let cases = [
        ("[[rule]]\nname = \"m\"\nlevel = \"raif1\"\nbranches = [\"a\", \"x\"]\n[default]\nlevel = \"raif1\"\n", "rule \"m\": unknown branch label \"x\""),
        ("[[rule]]\nname = \"m\"\nlevel = \"raif6\"\nbranches = [\"a\", \"b\", \"c\"]\n[default]\nlevel = \"raif1\"\n", "rule \"m\": raif6 needs at least 4 branches, got 3"),
        ("[[rule]]\nname = \"m\"\nlevel = \"raif5\"\nstripe_unit = \"48K\"\n[default]\nlevel = \"raif1\"\n", "rule \"m\": stripe unit 49152 bytes is not a power of two"),
        ("[default]\nlevel = \"raif7\"\n", "rule \"default\": unknown level \"raif7\""),
        ("[default]\nlevel = \"raif10\"\nbranches = [\"a\", \"b\", \"c\"]\n", "rule \"default\": raif10 needs at least 4 branches, got 3"),
        ("[[rule]]\nlevel = \"raif1\"\nglob = [\"[\"]\n[default]\nlevel = \"raif1\"\n", "rule \"#1\": glob \"[\""),
        ("[default]\nlevel = \"raif1\"\nbogus = 1\n", "unknown field `bogus`"),
        ("[[rule]]\nname = \"m\"\nlevel = \"raif1\"\n", "missing field `default`"),
    ];
    for (rest, expected) in cases {
        let error = config(rest).unwrap_err();
        assert!(
            error.contains(expected),
            "{error:?} should contain {expected:?}"
        );
        assert!(!error.contains('\n'), "one line: {error:?}");
    }
    let error = Config::parse("[default]\nlevel = \"raif1\"\n")
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("no branches"), "{error}");
}
