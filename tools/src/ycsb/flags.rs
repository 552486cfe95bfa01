//! YCSB's own command-line flags, as YCSB users type them (`-threads 4 -target 1000 -s -load
//! -P workloads/workloada`), rewritten into `shoal ycsb`'s before the command line is parsed.
//! `-P` and `-p` are `shoal ycsb`'s own short flags already.
//!
//! | YCSB | shoal ycsb |
//! |---|---|
//! | `-load` / `-t` | `load` / `run` |
//! | `-threads N` | `--workers N` |
//! | `-target N` | `--target N` |
//! | `-s` (status on standard error) | nothing: the per-second lines are printed anyway |
//! | `-db CLASS` | nothing: this driver always runs Shoal (said once on standard error) |

use std::ffi::OsString;

/// `argv` with YCSB's flags after `ycsb` rewritten (see the module's table); anything else,
/// and any other command's arguments, unchanged.
pub fn ycsb_style(argv: Vec<OsString>) -> Vec<OsString> {
    let is_ycsb = argv.get(1).is_some_and(|a| a == "ycsb");
    if !is_ycsb {
        return argv;
    }
    let mut out: Vec<OsString> = Vec::with_capacity(argv.len());
    let mut it = argv.into_iter();
    out.extend(it.by_ref().take(2));
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-load") => out.push("load".into()),
            Some("-t") => out.push("run".into()),
            Some("-threads") => out.push("--workers".into()),
            Some("-target") => out.push("--target".into()),
            Some("-s") => {}
            Some("-db") => {
                if let Some(class) = it.next() {
                    eprintln!(
                        "note: -db {}: shoal ycsb always runs Shoal's own binding",
                        class.to_string_lossy()
                    );
                }
            }
            Some("--") => {
                out.push(a);
                out.extend(it.by_ref());
            }
            _ => out.push(a),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::ycsb_style;

    fn args(s: &str) -> Vec<std::ffi::OsString> {
        s.split_whitespace().map(Into::into).collect()
    }

    #[test]
    fn ycsbs_flags_become_shoals() {
        assert_eq!(
            ycsb_style(args(
                "shoal ycsb -load -db site.ycsb.BasicDB -P workloada -threads 4 -s -p recordcount=10"
            )),
            args("shoal ycsb load -P workloada --workers 4 -p recordcount=10")
        );
        assert_eq!(
            ycsb_style(args("shoal ycsb -t -P workloadb -target 500 -threads 2")),
            args("shoal ycsb run -P workloadb --target 500 --workers 2")
        );
    }

    #[test]
    fn other_commands_and_shoals_own_flags_are_left_alone() {
        for s in [
            "shoal tpcc -t 3",
            "shoal ycsb --workers 4 --target 100 -P workloada",
            "shoal inspect -s",
        ] {
            assert_eq!(ycsb_style(args(s)), args(s));
        }
    }
}
