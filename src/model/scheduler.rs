//! The per-Service IPVS scheduler, from two annotations of our own (upstream
//! has one scheduler for every Service and refused a per-Service choice,
//! kubernetes issues 58329 and 121591):
//!
//! - `ipvs.kube-proxy-rs.io/scheduler`: one of the kernel's schedulers
//!   ([`SCHEDULERS`]);
//! - `ipvs.kube-proxy-rs.io/scheduler-flags`: for `sh` and `mh` only, a
//!   comma-separated list of `fallback` and `port` (or ipvsadm's names,
//!   `sh-fallback`, `sh-port`, `mh-fallback`, `mh-port`).
//!
//! Pure: [`from_annotations`] says what the Service asks for, or why it is
//! refused; a refused pair leaves the Service on the default scheduler
//! (`model::notice` says so once per event, naming the Service).

use std::collections::BTreeMap;
use std::fmt;

/// The scheduler annotation.
pub const ANNOTATION_SCHEDULER: &str = "ipvs.kube-proxy-rs.io/scheduler";
/// The scheduler-flags annotation (`sh` and `mh` only).
pub const ANNOTATION_SCHEDULER_FLAGS: &str = "ipvs.kube-proxy-rs.io/scheduler-flags";

/// The schedulers of Linux's IPVS (net/netfilter/ipvs/ip_vs_*.c). `twos`
/// came in 6.3; a kernel without a scheduler's module refuses the virtual
/// server (the op is retried and listed as failing).
pub const SCHEDULERS: [&str; 14] =
    ["rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh", "twos"];

/// A Service's own IPVS scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scheduler {
    /// One of [`SCHEDULERS`].
    pub name: &'static str,
    /// IP_VS_SVC_F_SCHED1: `sh-fallback` / `mh-fallback`, skip an unavailable
    /// (weight 0) real server instead of dropping.
    pub fallback: bool,
    /// IP_VS_SVC_F_SCHED2: `sh-port` / `mh-port`, hash the source port too.
    pub port: bool,
}

impl Scheduler {
    /// ipvsadm's names of the flags set, comma-separated (`sh-fallback,sh-port`),
    /// empty when none is.
    pub fn flag_names(&self) -> String {
        let mut out = Vec::new();
        if self.fallback {
            out.push(format!("{}-fallback", self.name));
        }
        if self.port {
            out.push(format!("{}-port", self.name));
        }
        out.join(",")
    }
}

impl fmt::Display for Scheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)?;
        match self.flag_names() {
            flags if flags.is_empty() => Ok(()),
            flags => write!(f, " ({flags})"),
        }
    }
}

/// Why a Service's scheduler annotations are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The annotation at fault.
    pub field: &'static str,
    pub value: String,
    pub reason: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "annotation {} {:?}: {}; the default scheduler is used", self.field, self.value, self.reason)
    }
}

/// The scheduler a Service's annotations ask for: `Ok(None)` without them
/// (an empty value counts as absent), `Err` when they are invalid (the
/// Service then gets the default scheduler, flags and all).
pub fn from_annotations(annotations: Option<&BTreeMap<String, String>>) -> Result<Option<Scheduler>, Refused> {
    let get = |key: &str| annotations.and_then(|a| a.get(key)).map(|v| v.trim()).filter(|v| !v.is_empty());
    let flags = get(ANNOTATION_SCHEDULER_FLAGS);
    let Some(value) = get(ANNOTATION_SCHEDULER) else {
        return match flags {
            None => Ok(None),
            Some(f) => Err(refused(ANNOTATION_SCHEDULER_FLAGS, f, format!("needs {ANNOTATION_SCHEDULER} sh or mh"))),
        };
    };
    let Some(name) = SCHEDULERS.iter().copied().find(|s| *s == value) else {
        let reason = format!("not an IPVS scheduler (one of {})", SCHEDULERS.join(", "));
        return Err(refused(ANNOTATION_SCHEDULER, value, reason));
    };
    let mut sched = Scheduler { name, fallback: false, port: false };
    let Some(flags) = flags else { return Ok(Some(sched)) };
    if name != "sh" && name != "mh" {
        return Err(refused(ANNOTATION_SCHEDULER_FLAGS, flags, format!("only sh and mh take flags, not {name}")));
    }
    for item in flags.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let bare = item.strip_prefix(name).and_then(|s| s.strip_prefix('-')).unwrap_or(item);
        match bare {
            "fallback" => sched.fallback = true,
            "port" => sched.port = true,
            _ => {
                let reason = format!("unknown flag {item:?} for {name} (fallback, port, {name}-fallback, {name}-port)");
                return Err(refused(ANNOTATION_SCHEDULER_FLAGS, flags, reason));
            }
        }
    }
    Ok(Some(sched))
}

fn refused(field: &'static str, value: &str, reason: String) -> Refused {
    Refused { field, value: value.to_string(), reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Option<Scheduler>, Refused> {
        let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        from_annotations(Some(&map))
    }

    fn sched(name: &'static str, fallback: bool, port: bool) -> Option<Scheduler> {
        Some(Scheduler { name, fallback, port })
    }

    const S: &str = ANNOTATION_SCHEDULER;
    const F: &str = ANNOTATION_SCHEDULER_FLAGS;

    #[test]
    fn no_annotation_or_an_empty_one_is_the_default() {
        assert_eq!(from_annotations(None), Ok(None));
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&[("other", "sh")]), Ok(None));
        assert_eq!(parse(&[(S, " ")]), Ok(None));
        assert_eq!(parse(&[(S, ""), (F, "")]), Ok(None));
    }

    #[test]
    fn every_kernel_scheduler_is_taken() {
        for name in SCHEDULERS {
            assert_eq!(parse(&[(S, name)]), Ok(sched(name, false, false)), "{name}");
        }
        assert_eq!(parse(&[(S, " sh\n")]), Ok(sched("sh", false, false)), "surrounding blanks are trimmed");
    }

    #[test]
    fn flags_by_short_or_ipvsadm_name_for_sh_and_mh() {
        assert_eq!(parse(&[(S, "sh"), (F, "fallback,port")]), Ok(sched("sh", true, true)));
        assert_eq!(parse(&[(S, "sh"), (F, "sh-port")]), Ok(sched("sh", false, true)));
        assert_eq!(parse(&[(S, "mh"), (F, " mh-fallback , ")]), Ok(sched("mh", true, false)));
        assert_eq!(parse(&[(S, "mh"), (F, "port,port")]), Ok(sched("mh", false, true)));
        assert_eq!(sched("mh", true, true).map(|s| s.flag_names()), Some("mh-fallback,mh-port".into()));
        assert_eq!(sched("sh", false, true).map(|s| s.to_string()), Some("sh (sh-port)".into()));
        assert_eq!(sched("rr", false, false).map(|s| s.to_string()), Some("rr".into()));
    }

    #[test]
    fn an_unknown_scheduler_is_refused_naming_the_annotation() {
        let e = parse(&[(S, "random")]).unwrap_err();
        assert_eq!((e.field, e.value.as_str()), (S, "random"));
        assert!(e.reason.starts_with("not an IPVS scheduler (one of rr, wrr, lc,"), "{}", e.reason);
        assert_eq!(e.to_string(), format!("annotation {S} \"random\": {}; the default scheduler is used", e.reason));
        // Names are the kernel's, lower case.
        assert_eq!(parse(&[(S, "SH")]).unwrap_err().field, S);
        // A bad scheduler with good flags: the scheduler is named.
        assert_eq!(parse(&[(S, "shh"), (F, "port")]).unwrap_err().field, S);
    }

    #[test]
    fn flags_are_refused_without_sh_or_mh_or_when_unknown() {
        let e = parse(&[(S, "rr"), (F, "port")]).unwrap_err();
        assert_eq!((e.field, e.reason.as_str()), (F, "only sh and mh take flags, not rr"));
        let e = parse(&[(F, "fallback")]).unwrap_err();
        assert_eq!((e.field, e.reason), (F, format!("needs {S} sh or mh")));
        let e = parse(&[(S, "sh"), (F, "fallback,persist")]).unwrap_err();
        assert_eq!((e.field, e.value.as_str()), (F, "fallback,persist"));
        assert!(e.reason.contains("unknown flag \"persist\" for sh"), "{}", e.reason);
        // Another scheduler's flag name.
        assert!(parse(&[(S, "sh"), (F, "mh-port")]).is_err());
    }
}
