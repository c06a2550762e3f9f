//! A minimal W3C WebDriver client for Debian's headless Chromium: starts
//! `/usr/bin/chromedriver` on a loopback port, opens one session with a
//! fresh profile, and speaks the few commands the dashboard test needs
//! (navigate, execute script, resize, screenshot) over hyper's HTTP/1.1
//! client. Missing binaries are a failure, never a skip.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Chromium's flags: headless, no sandbox (CI runs as root), no traffic of
/// its own (updates, sync, first-run pings, field trials), and a dead
/// loopback proxy for anything not on loopback (loopback bypasses proxies),
/// so nothing leaves the host.
const CHROME_ARGS: [&str; 17] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-features=Translate,OptimizationHints,MediaRouter",
    "--proxy-server=127.0.0.1:9",
    "--hide-scrollbars",
    "--window-size=1280,900",
];

/// One WebDriver error or transport failure, as text for the assertion.
pub type WdResult<T> = Result<T, String>;

/// chromedriver plus one open browser session; dropping it closes both.
pub struct Browser {
    driver: Child,
    addr: SocketAddr,
    session: Option<String>,
    log: std::path::PathBuf,
    _profile: tempfile::TempDir,
}

/// Panics, naming the install script, unless `path` is an executable file.
fn require(path: &str) {
    use std::os::unix::fs::PermissionsExt;
    let ok = std::fs::metadata(path).map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0).unwrap_or(false);
    assert!(ok, "{path} is missing: install Debian's chromium and chromium-driver (bash .ci/install-deps.sh, as root)");
}

fn free_loopback_port() -> u16 {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
    l.local_addr().expect("local addr").port()
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session.
    pub async fn start() -> Browser {
        require(CHROMIUM);
        require(CHROMEDRIVER);
        let profile = tempfile::tempdir().expect("temp dir");
        let log = profile.path().join("chromedriver.log");
        let port = free_loopback_port();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {CHROMEDRIVER}: {e}"));
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut b = Browser { driver, addr, session: None, log, _profile: profile };
        b.wait_ready().await;
        let id = b.new_session().await.unwrap_or_else(|e| panic!("new session: {e}\n{}", b.driver_log()));
        b.session = Some(id);
        b
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(v) = request(self.addr, "GET", "/status", None).await {
                if v["ready"] == json!(true) {
                    return;
                }
            }
            if let Ok(Some(status)) = self.driver.try_wait() {
                panic!("chromedriver exited ({status}) before it was ready\n{}", self.driver_log());
            }
            assert!(Instant::now() < deadline, "chromedriver not ready after 15s\n{}", self.driver_log());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn new_session(&self) -> WdResult<String> {
        let mut args: Vec<String> = CHROME_ARGS.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", self._profile.path().join("profile").display()));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let v = request(self.addr, "POST", "/session", Some(caps)).await?;
        v["sessionId"].as_str().map(str::to_string).ok_or_else(|| format!("no sessionId in {v}"))
    }

    /// The chromedriver log's last lines, for failure messages.
    pub fn driver_log(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        format!("--- chromedriver log (tail) ---\n{}", lines[lines.len().saturating_sub(30)..].join("\n"))
    }

    async fn command(&self, method: &str, cmd: &str, body: Option<Value>) -> WdResult<Value> {
        let id = self.session.as_deref().ok_or("no session")?;
        request(self.addr, method, &format!("/session/{id}{cmd}"), body).await
    }

    /// Navigates and waits for the page to load.
    pub async fn goto(&self, url: &str) -> WdResult<()> {
        self.command("POST", "/url", Some(json!({ "url": url }))).await.map(drop)
    }

    /// Runs `script` (a function body) in the page; returns its result.
    pub async fn execute(&self, script: &str) -> WdResult<Value> {
        self.command("POST", "/execute/sync", Some(json!({ "script": script, "args": [] }))).await
    }

    /// Resizes the window.
    pub async fn resize(&self, width: u32, height: u32) -> WdResult<()> {
        self.command("POST", "/window/rect", Some(json!({ "width": width, "height": height }))).await.map(drop)
    }

    /// A PNG of the viewport.
    pub async fn screenshot(&self) -> WdResult<Vec<u8>> {
        let v = self.command("GET", "/screenshot", None).await?;
        base64_decode(v.as_str().ok_or("screenshot is not a string")?)
    }

    /// Ends the session (Chromium quits) and stops chromedriver.
    pub async fn close(mut self) {
        if let Some(id) = self.session.take() {
            if let Err(e) = request(self.addr, "DELETE", &format!("/session/{id}"), None).await {
                eprintln!("closing the WebDriver session: {e}");
            }
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(id) = self.session.take() {
            // A failed test never reached close(): end the session so Chromium quits.
            delete_blocking(self.addr, &id);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// `DELETE /session/{id}` on a plain blocking socket (usable in `Drop`).
fn delete_blocking(addr: SocketAddr, id: &str) {
    use std::io::{Read, Write};
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else { return };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let req = format!("DELETE /session/{id} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_ok() {
        let _ = s.read_to_end(&mut Vec::new());
    }
}

/// One WebDriver request; returns the response's `value`, or its error.
async fn request(addr: SocketAddr, method: &str, path: &str, body: Option<Value>) -> WdResult<Value> {
    let stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect {addr}: {e}"))?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json; charset=utf-8")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| format!("{method} {path}: {e}"))?;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| format!("{method} {path}: {e}"))?;
    if !status.is_success() {
        let (err, msg) = (&v["value"]["error"], &v["value"]["message"]);
        return Err(format!("{method} {path}: HTTP {status}: {err}: {msg}"));
    }
    Ok(v["value"].clone())
}

/// Standard base64 (as WebDriver screenshots are encoded).
pub fn base64_decode(text: &str) -> WdResult<Vec<u8>> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=') {
        let v = value(c).ok_or_else(|| format!("bad base64 byte {c:#x}"))?;
        acc = ((acc << 6) | u32::from(v)) & 0xffff;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    Ok(out)
}

/// Writes `png` to `path`, creating the directory.
pub fn save(path: &Path, png: &[u8]) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    }
    std::fs::write(path, png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}
