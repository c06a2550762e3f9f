//! Reading and setting sysctls (and module parameters, which are files of
//! the same form): setting one only if it differs (upstream's
//! `EnsureSysctl`), and the list IPVS mode needs (docs/upstream/ipvs.md e.1).

use std::path::Path;

use tracing::info;

use super::KernelError;

/// Where sysctls live.
pub const PROC_SYS: &str = "/proc/sys";

/// Sets `/proc/sys/<path>` to `value` if it holds something else; returns
/// whether it changed it.
pub fn ensure_sysctl(path: &str, value: i64) -> Result<bool, KernelError> {
    ensure_sysctl_at(Path::new(PROC_SYS), path, value)
}

/// [`ensure_sysctl`] under another root (a module's parameters, tests).
pub fn ensure_sysctl_at(root: &Path, path: &str, value: i64) -> Result<bool, KernelError> {
    let file = root.join(path);
    let op = format!("sysctl {path}={value}");
    let io_err = |what: &str, e: std::io::Error| {
        let context = std::io::Error::new(e.kind(), format!("{what} {}: {e}", file.display()));
        KernelError::library(&op, true, e.raw_os_error(), context)
    };
    let current = std::fs::read_to_string(&file).map_err(|e| io_err("reading", e))?;
    if current.trim().parse::<i64>().ok() == Some(value) {
        return Ok(false);
    }
    std::fs::write(&file, format!("{value}\n")).map_err(|e| io_err("writing", e))?;
    info!(sysctl = path, from = current.trim(), to = value, "sysctl set");
    Ok(true)
}

/// The number in `<root>/<path>` (a sysctl under [`PROC_SYS`], a module
/// parameter under `/sys/module/<module>/parameters`).
pub fn read_sysctl_at(root: &Path, path: &str) -> Result<i64, KernelError> {
    let file = root.join(path);
    let op = format!("read sysctl {path}");
    let text = std::fs::read_to_string(&file).map_err(|e| {
        let context = std::io::Error::new(e.kind(), format!("reading {}: {e}", file.display()));
        KernelError::library(&op, true, e.raw_os_error(), context)
    })?;
    text.trim().parse::<i64>().map_err(|e| {
        let context = std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", file.display()));
        KernelError::library(&op, true, None, context)
    })
}

/// Whether `/proc/sys/PATH` is readable and holds a non-zero number
/// (read-only; a missing or unreadable setting is off).
pub fn is_on(path: &str) -> bool {
    std::fs::read_to_string(Path::new("/proc/sys").join(path))
        .ok()
        .and_then(|v| v.trim().parse::<i64>().ok())
        .is_some_and(|v| v != 0)
}

/// The running kernel's release (`/proc/sys/kernel/osrelease`), as upstream reads it.
pub fn kernel_release() -> Result<String, KernelError> {
    let file = Path::new(PROC_SYS).join("kernel/osrelease");
    std::fs::read_to_string(&file).map(|s| s.trim().to_string()).map_err(|e| {
        let context = std::io::Error::new(e.kind(), format!("{}: {e}", file.display()));
        KernelError::library("read kernel release", true, e.raw_os_error(), context)
    })
}

/// (major, minor) of a release such as `5.15.0-91-generic` or `6.1`.
pub fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Upstream's sysctls for IPVS mode, in its order: (path under /proc/sys,
/// value). `net/ipv4/vs/conn_reuse_mode=0` only on kernels >= 4.1 and < 5.9
/// (newer ones fixed the reuse bug; an unreadable release leaves it alone);
/// the ARP ones only with strictARP.
pub fn ipvs_sysctls(strict_arp: bool, kernel_release: &str) -> Vec<(&'static str, i64)> {
    let mut out = vec![("net/ipv4/vs/conntrack", 1)];
    if let Some(v) = kernel_version(kernel_release) {
        if ((4, 1)..(5, 9)).contains(&v) {
            out.push(("net/ipv4/vs/conn_reuse_mode", 0));
        }
    }
    out.extend([
        ("net/ipv4/vs/expire_nodest_conn", 1),
        ("net/ipv4/vs/expire_quiescent_template", 1),
        ("net/ipv4/ip_forward", 1),
    ]);
    if strict_arp {
        out.extend([("net/ipv4/conf/all/arp_ignore", 1), ("net/ipv4/conf/all/arp_announce", 2)]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conn_reuse_mode_only_between_4_1_and_5_9() {
        let cases = [
            ("3.10.0-1160.el7.x86_64", false),
            ("4.0.9", false),
            ("4.1.0", true),
            ("4.19.0-26-amd64", true),
            ("5.4.0-150-generic", true),
            ("5.8.18", true),
            ("5.9.0", false),
            ("5.15.0-91-generic", false),
            ("6.18.44-fc-v595", false),
            ("garbage", false),
        ];
        for (release, want) in cases {
            let got = ipvs_sysctls(false, release).iter().any(|(p, v)| *p == "net/ipv4/vs/conn_reuse_mode" && *v == 0);
            assert_eq!(got, want, "{release}");
        }
    }

    #[test]
    fn upstreams_list_in_order_with_strict_arp() {
        let got = ipvs_sysctls(true, "5.4.0");
        let want = [
            ("net/ipv4/vs/conntrack", 1),
            ("net/ipv4/vs/conn_reuse_mode", 0),
            ("net/ipv4/vs/expire_nodest_conn", 1),
            ("net/ipv4/vs/expire_quiescent_template", 1),
            ("net/ipv4/ip_forward", 1),
            ("net/ipv4/conf/all/arp_ignore", 1),
            ("net/ipv4/conf/all/arp_announce", 2),
        ];
        assert_eq!(got, want);
        assert_eq!(ipvs_sysctls(false, "6.1.0").len(), 4);
    }

    #[test]
    fn parses_kernel_releases() {
        assert_eq!(kernel_version("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(kernel_version("6.1"), Some((6, 1)));
        assert_eq!(kernel_version("4.9+"), Some((4, 9)));
        assert_eq!(kernel_version("v5"), None);
    }

    #[test]
    fn sets_only_what_differs() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("net/ipv4")).expect("mkdir");
        let f = dir.path().join("net/ipv4/ip_forward");
        std::fs::write(&f, "0\n").expect("write");
        assert_eq!(ensure_sysctl_at(dir.path(), "net/ipv4/ip_forward", 1), Ok(true));
        assert_eq!(std::fs::read_to_string(&f).expect("read"), "1\n");
        assert_eq!(ensure_sysctl_at(dir.path(), "net/ipv4/ip_forward", 1), Ok(false));
        let err = ensure_sysctl_at(dir.path(), "net/ipv4/vs/conntrack", 1).expect_err("missing");
        assert_eq!(err.op(), "sysctl net/ipv4/vs/conntrack=1");
        assert_eq!(err.errno_value(), Some(2));
        assert_eq!(ensure_sysctl_at(dir.path(), "net/ipv4/ip_forward", 4_294_967_296), Ok(true), "beyond i32");
        assert_eq!(read_sysctl_at(dir.path(), "net/ipv4/ip_forward"), Ok(4_294_967_296));
        assert_eq!(read_sysctl_at(dir.path(), "net/ipv4/nope").expect_err("missing").errno_value(), Some(2));
        std::fs::write(&f, "x\n").expect("write");
        assert_eq!(
            read_sysctl_at(dir.path(), "net/ipv4/ip_forward").expect_err("not a number").op(),
            "read sysctl net/ipv4/ip_forward"
        );
    }
}
