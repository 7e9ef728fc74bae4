//! What `/proc/<pid>/stat` (and a thread's `/proc/<pid>/task/<tid>/stat`) says, per proc(5):
//! `pid (comm) state ppid … utime stime …`. The command name may hold spaces and parentheses,
//! so the fields are the ones after its last `)`. Pure: callers read the file (on this host or
//! inside a container) and hand the text here.

/// The fields of one `/proc/…/stat` text after the command name, the process state first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat<'a> {
    fields: Vec<&'a str>,
}

/// Index after the command name of the parent's pid (the 4th field of the file).
const PPID: usize = 1;
/// Index after the command name of the user CPU time in clock ticks (the 14th field); the
/// system time (`stime`) follows it.
const UTIME: usize = 11;

impl<'a> ProcStat<'a> {
    /// The fields of `text`; `None` when it has no command name in parentheses.
    pub fn parse(text: &'a str) -> Option<Self> {
        let (_, rest) = text.rsplit_once(')')?;
        Some(Self {
            fields: rest.split_whitespace().collect(),
        })
    }

    /// Whether the process (or thread) runs: its state is neither zombie (`Z`) nor dead (`X`).
    pub fn runs(&self) -> bool {
        self.fields
            .first()
            .is_some_and(|state| *state != "Z" && *state != "X")
    }

    /// The parent's pid.
    pub fn parent(&self) -> Option<u32> {
        self.fields.get(PPID)?.parse().ok()
    }

    /// User plus system CPU time, in clock ticks (`USER_HZ`, 100 a second on Linux).
    pub fn cpu_ticks(&self) -> Option<u64> {
        let user: u64 = self.fields.get(UTIME)?.parse().ok()?;
        let system: u64 = self.fields.get(UTIME + 1)?.parse().ok()?;
        Some(user + system)
    }
}

/// Clock ticks a second in `/proc/…/stat` times (`USER_HZ`; 100 on every Linux this runs on).
pub const TICKS_PER_SECOND: f64 = 100.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_after_the_last_parenthesis_of_the_name() {
        let stat = "4242 (a (b) c) S 7 4242 4242 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 3 0";
        let parsed = ProcStat::parse(stat).expect("a stat line");
        assert!(parsed.runs());
        assert_eq!(parsed.parent(), Some(7));
        assert_eq!(parsed.cpu_ticks(), Some(280));
    }

    #[test]
    fn zombies_and_dead_threads_do_not_run_and_garbage_says_nothing() {
        for (stat, runs) in [
            ("1 (etcd) R 0", true),
            ("1 (etcd) D 0", true),
            ("1 (etcd) Z 0", false),
            ("1 (etcd) X 0", false),
        ] {
            assert_eq!(
                ProcStat::parse(stat).map(|s| s.runs()),
                Some(runs),
                "{stat}"
            );
        }
        assert_eq!(ProcStat::parse("no name here"), None);
        let short = ProcStat::parse("1 (sh) S 0").expect("a stat line");
        assert_eq!((short.cpu_ticks(), short.parent()), (None, Some(0)));
    }
}
