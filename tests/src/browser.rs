//! A real browser for the tests: headless Chromium driven over WebDriver by `chromedriver`, both
//! from Debian (`chromium`, `chromium-driver`), installed by `make tools` like grpcurl.
//!
//! [`Browser::start`] starts a `chromedriver` of its own on a loopback port the kernel picks, in
//! a process group of its own, waits (with a deadline) until its `/status` says it is ready, and
//! opens a session with headless Chromium in a fresh profile directory. [`Browser::close`] ends the
//! session; dropping the [`Browser`] (also on a failed assertion) kills the whole process group,
//! chromedriver and every Chromium process it started, so no browser outlives its test.
//!
//! The client is [fantoccini](https://docs.rs/fantoccini) over plain HTTP: it only ever talks to
//! the chromedriver on 127.0.0.1, so it needs no TLS stack. The pages the browser loads are the
//! test's own servers on loopback too.

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;
use tempfile::TempDir;

/// How long chromedriver may take to answer `/status` and Chromium to open a session; a healthy
/// start takes about a second.
pub const START_DEADLINE: Duration = Duration::from_secs(60);

/// Default for every wait on a page ([`Browser::wait_for`] and friends).
pub const WAIT_DEADLINE: Duration = Duration::from_secs(30);

/// The viewport (and so the screenshot) size.
pub const WINDOW: (u32, u32) = (1280, 900);

/// Chromium's arguments: headless, and without what this machine (a container with no GPU, no
/// network but loopback, little /dev/shm) cannot give it or the test does not want (first-run
/// pages, background fetches, component updates, sync).
const CHROMIUM_ARGS: [&str; 10] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
];

/// A command the harness runs: `$<env>` when set, else `name` found on the PATH; an error saying
/// to run `make tools` when it is neither.
fn tool(env: &str, name: &str, package: &str) -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        let path = PathBuf::from(path);
        if !path.is_file() {
            bail!("{env} names {}, which is not a file", path.display());
        }
        return Ok(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| {
            anyhow!(
                "{name} is not installed (Debian package {package}): run `make tools` \
                 (`make test` does it first), or point {env} at a {name} binary"
            )
        })
}

/// The chromedriver the harness starts: `$OUTBOX_CHROMEDRIVER`, or `chromedriver` on the PATH.
pub fn chromedriver_path() -> Result<PathBuf> {
    tool("OUTBOX_CHROMEDRIVER", "chromedriver", "chromium-driver")
}

/// The Chromium it drives: `$OUTBOX_CHROMIUM`, or `chromium` on the PATH.
pub fn chromium_path() -> Result<PathBuf> {
    tool("OUTBOX_CHROMIUM", "chromium", "chromium")
}

/// A chromedriver process group: killed (chromedriver and every Chromium process under it) when
/// dropped.
struct Driver {
    child: std::process::Child,
    addr: SocketAddr,
    /// Where its output and log files are.
    dir: PathBuf,
}

/// The line chromedriver prints once it listens, naming the port it bound (with `--port=0`, the
/// one the kernel picked).
const STARTED: &str = "ChromeDriver was started successfully on port ";

impl Driver {
    /// Starts chromedriver on a port the kernel picks (`--port=0`) and learns that port from
    /// its "started successfully on port N" line, so no other process can take the port between
    /// picking and binding it. Its stdout and stderr go to a log file in `dir`, with its own
    /// `--log-path` log.
    async fn start(binary: &Path, dir: &Path, deadline: tokio::time::Instant) -> Result<Self> {
        use std::io::{BufRead, Write};

        let log = dir.join("chromedriver.log");
        let output = dir.join("chromedriver.out");
        let mut child = std::process::Command::new(binary)
            .arg("--port=0")
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&output)?)
            // Its own process group, so that Drop can kill Chromium with it: chromedriver's
            // children (the browser, its zygote, renderers) stay in the group it starts in.
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stdout = child.stdout.take().context("chromedriver's stdout")?;
        let (port_tx, port_rx) = tokio::sync::oneshot::channel();
        // Reads stdout to its end (so chromedriver never blocks on a full pipe), copying it to
        // the output file, and hands over the port from the "started" line.
        let mut copy = std::fs::OpenOptions::new().append(true).open(&output)?;
        std::thread::spawn(move || {
            let mut port_tx = Some(port_tx);
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(copy, "{line}");
                if let Some(port) = line
                    .strip_prefix(STARTED)
                    .and_then(|rest| rest.trim_end_matches('.').parse::<u16>().ok())
                    && let Some(tx) = port_tx.take()
                {
                    let _ = tx.send(port);
                }
            }
        });
        let mut driver = Self {
            child,
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            dir: dir.to_path_buf(),
        };
        match tokio::time::timeout_at(deadline, port_rx).await {
            Ok(Ok(port)) => driver.addr.set_port(port),
            Ok(Err(_)) => bail!(
                "chromedriver ended its output without saying which port it listens on; \
                 its output:\n{}",
                driver.log_tail()
            ),
            Err(_) => bail!(
                "chromedriver did not say which port it listens on within {START_DEADLINE:?}; \
                 its output:\n{}",
                driver.log_tail()
            ),
        }
        driver.wait_ready(deadline).await?;
        Ok(driver)
    }

    /// The end of chromedriver's output and log, for error messages.
    fn log_tail(&self) -> String {
        let mut shown = String::new();
        for name in ["chromedriver.out", "chromedriver.log"] {
            let text = std::fs::read_to_string(self.dir.join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            shown.push_str(&format!("--- {name}\n"));
            shown.push_str(&lines[lines.len().saturating_sub(30)..].join("\n"));
            shown.push('\n');
        }
        shown
    }

    /// Waits until `GET /status` answers `"ready": true`, failing early if chromedriver exits.
    async fn wait_ready(&mut self, deadline: tokio::time::Instant) -> Result<()> {
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "chromedriver exited ({status}) before it was ready; its output:\n{}",
                    self.log_tail()
                );
            }
            if let Ok(Ok(status)) =
                tokio::time::timeout(Duration::from_secs(2), get_status(self.addr)).await
                && status["value"]["ready"] == true
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!(
                    "chromedriver on {} did not answer /status as ready within {:?}; \
                     its output:\n{}",
                    self.addr,
                    START_DEADLINE,
                    self.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The element was replaced (or its page left) after it was found.
fn is_stale(error: &fantoccini::error::CmdError) -> bool {
    matches!(
        error,
        fantoccini::error::CmdError::Standard(e)
            if e.error == fantoccini::error::ErrorStatus::StaleElementReference
    )
}

/// chromedriver's `GET /status` answer. By hand: chromedriver keeps the connection open whatever
/// the request says, so the body is read by its Content-Length, not to the end of the stream.
async fn get_status(addr: SocketAddr) -> Result<serde_json::Value> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET /status HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).await?;
    if status_line.split(' ').nth(1) != Some("200") {
        bail!("/status answered {status_line:?}");
    }
    let mut length = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await? == 0 {
            bail!("/status: the connection closed in the headers");
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':')
            && name.eq_ignore_ascii_case("content-length")
        {
            length = Some(value.trim().parse::<usize>()?);
        }
    }
    let mut body = vec![0; length.context("/status: no Content-Length")?];
    reader.read_exact(&mut body).await?;
    Ok(serde_json::from_slice(&body)?)
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The whole group: chromedriver, and Chromium with all its helper processes.
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Headless Chromium under a chromedriver of its own; see the module docs.
pub struct Browser {
    client: Client,
    // Dropped in this order: the processes are killed before their profile directory goes.
    driver: Driver,
    _dir: TempDir,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser")
            .field("chromedriver", &self.driver.addr)
            .finish_non_exhaustive()
    }
}

impl Browser {
    /// Starts chromedriver and opens a headless Chromium session in a fresh profile. Fails
    /// saying to run `make tools` when chromium or chromedriver is not installed.
    pub async fn start() -> Result<Self> {
        let chromedriver = chromedriver_path()?;
        let chromium = chromium_path()?;
        let dir = tempfile::Builder::new()
            .prefix("outbox-browser-")
            .tempdir()
            .context("creating the browser's temporary directory")?;
        let profile = dir.path().join("profile");
        std::fs::create_dir(&profile)?;
        let deadline = tokio::time::Instant::now() + START_DEADLINE;
        let driver = Driver::start(&chromedriver, dir.path(), deadline).await?;
        let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_str().context("chromium's path is not UTF-8")?,
                "args": args,
            },
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            unreachable!("a JSON object literal")
        };
        let url = format!("http://{}", driver.addr);
        let mut builder = ClientBuilder::new(HttpConnector::new());
        builder.capabilities(capabilities);
        let session = builder.connect(&url);
        let client = match tokio::time::timeout_at(deadline, session).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => bail!(
                "chromedriver could not start Chromium ({}): {e}; chromedriver's log:\n{}",
                chromium.display(),
                driver.log_tail()
            ),
            Err(_) => bail!(
                "Chromium did not start within {START_DEADLINE:?}; chromedriver's log:\n{}",
                driver.log_tail()
            ),
        };
        let browser = Self {
            client,
            driver,
            _dir: dir,
        };
        browser.fit_viewport().await?;
        Ok(browser)
    }

    /// Resizes the window so that the page's viewport, and so every screenshot, is [`WINDOW`]:
    /// `--window-size` sets the outer window, which headless Chromium also gives a frame.
    async fn fit_viewport(&self) -> Result<()> {
        let (width, height) = WINDOW;
        for _ in 0..3 {
            let inner = self
                .client
                .execute("return [window.innerWidth, window.innerHeight];", vec![])
                .await
                .context("reading the viewport's size")?;
            let inner: (u32, u32) = serde_json::from_value(inner)?;
            if inner == WINDOW {
                return Ok(());
            }
            let (outer_width, outer_height) = self.client.get_window_size().await?;
            let frame = |outer: u64, inner: u32| outer.saturating_sub(u64::from(inner)) as u32;
            self.client
                .set_window_size(
                    width + frame(outer_width, inner.0),
                    height + frame(outer_height, inner.1),
                )
                .await
                .context("resizing the window")?;
        }
        bail!("could not make the viewport {width}x{height}")
    }

    /// The WebDriver client, for everything the helpers here do not cover.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Loads `url` and waits until the page has loaded.
    pub async fn goto(&self, url: &str) -> Result<()> {
        self.client
            .goto(url)
            .await
            .with_context(|| format!("loading {url}"))
    }

    /// The first element matching the CSS selector `css`, once there is one (within
    /// [`WAIT_DEADLINE`]); the error names the selector, the URL and what the page shows.
    pub async fn wait_for(&self, css: &str) -> Result<Element> {
        match self
            .client
            .wait()
            .at_most(WAIT_DEADLINE)
            .every(Duration::from_millis(50))
            .for_element(Locator::Css(css))
            .await
        {
            Ok(element) => Ok(element),
            Err(e) => Err(anyhow!(
                "expected an element `{css}` within {WAIT_DEADLINE:?} ({e}); the page shows:\n{}",
                self.page_summary().await
            )),
        }
    }

    /// Every element matching `css` now (perhaps none).
    pub async fn find_all(&self, css: &str) -> Result<Vec<Element>> {
        Ok(self.client.find_all(Locator::Css(css)).await?)
    }

    /// The trimmed text of the first element matching `css`, once there is one.
    pub async fn text_of(&self, css: &str) -> Result<String> {
        self.wait_for_text(css, "an element", false, WAIT_DEADLINE, |_| true)
            .await
    }

    /// Polls the page until `check` accepts the text of the first element matching `css`
    /// (reloading the page before each look when `reload`), within `deadline`; returns that
    /// text. The error says what was expected (`what`) and what the element or page showed last.
    pub async fn wait_for_text(
        &self,
        css: &str,
        what: &str,
        reload: bool,
        deadline: Duration,
        check: impl Fn(&str) -> bool,
    ) -> Result<String> {
        let until = tokio::time::Instant::now() + deadline;
        let mut last = String::from("(no such element)");
        loop {
            if reload {
                self.client.refresh().await?;
            }
            // A page refreshing itself may replace the element between finding and reading it.
            if let Ok(element) = self.client.find(Locator::Css(css)).await
                && let Ok(text) = element.text().await
            {
                let text = text.trim().to_owned();
                if check(&text) {
                    return Ok(text);
                }
                last = text;
            }
            if tokio::time::Instant::now() >= until {
                bail!(
                    "expected {what} in `{css}` within {deadline:?}; it showed {last:?}; \
                     the page shows:\n{}",
                    self.page_summary().await
                );
            }
            tokio::time::sleep(Duration::from_millis(if reload { 250 } else { 100 })).await;
        }
    }

    /// Waits until the current URL satisfies `check` (`what` names it in the error); returns it.
    pub async fn wait_for_url(
        &self,
        what: &str,
        check: impl Fn(&url::Url) -> bool,
    ) -> Result<url::Url> {
        let until = tokio::time::Instant::now() + WAIT_DEADLINE;
        loop {
            let url = self.client.current_url().await?;
            if check(&url) {
                return Ok(url);
            }
            if tokio::time::Instant::now() >= until {
                bail!(
                    "expected the URL to be {what} within {WAIT_DEADLINE:?}; the page shows:\n{}",
                    self.page_summary().await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Types `text` into the first element matching `css` (after clearing it).
    pub async fn fill(&self, css: &str, text: &str) -> Result<()> {
        let field = self.wait_for(css).await?;
        field.clear().await?;
        field.send_keys(text).await?;
        Ok(())
    }

    /// Clicks the first element matching `css`. A page that refreshes parts of itself may
    /// replace the element between finding and clicking it; then it is found again and clicked
    /// (a stale element was never clicked, so nothing happens twice).
    pub async fn click(&self, css: &str) -> Result<()> {
        let until = tokio::time::Instant::now() + WAIT_DEADLINE;
        loop {
            match self.wait_for(css).await?.click().await {
                Ok(()) => return Ok(()),
                Err(e) if is_stale(&e) && tokio::time::Instant::now() < until => {}
                Err(e) => return Err(anyhow!("clicking `{css}`: {e}")),
            }
        }
    }

    /// The trimmed text of every element matching `css` now, read again if the page replaced
    /// one of them meanwhile.
    pub async fn texts_of(&self, css: &str) -> Result<Vec<String>> {
        let until = tokio::time::Instant::now() + WAIT_DEADLINE;
        'again: loop {
            let mut texts = Vec::new();
            for element in self.find_all(css).await? {
                match element.text().await {
                    Ok(text) => texts.push(text.trim().to_owned()),
                    Err(e) if is_stale(&e) && tokio::time::Instant::now() < until => {
                        continue 'again;
                    }
                    Err(e) => return Err(anyhow!("reading `{css}`: {e}")),
                }
            }
            return Ok(texts);
        }
    }

    /// The current URL and the start of the page's visible text: what a failure message shows.
    pub async fn page_summary(&self) -> String {
        let url = self
            .client
            .current_url()
            .await
            .map_or_else(|e| format!("(no URL: {e})"), |u| u.to_string());
        let text = match self.client.find(Locator::Css("body")).await {
            Ok(body) => body.text().await.unwrap_or_else(|e| format!("({e})")),
            Err(e) => format!("(no body: {e})"),
        };
        let mut shown: String = text.chars().take(2000).collect();
        if shown.len() < text.len() {
            shown.push_str("\n[...]");
        }
        format!("URL {url}\n{shown}")
    }

    /// A PNG screenshot of the window, written to `path` (its directory is created).
    pub async fn screenshot(&self, path: &Path) -> Result<()> {
        let png = self
            .client
            .screenshot()
            .await
            .context("taking a screenshot")?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(path, png).with_context(|| format!("writing {}", path.display()))
    }

    /// Ends the session (Chromium quits) and stops chromedriver.
    pub async fn close(self) -> Result<()> {
        let Self {
            client,
            driver,
            _dir,
        } = self;
        let closed = client.close().await;
        drop(driver);
        closed.context("ending the WebDriver session")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A page with a form whose submit changes the page, served by a tiny axum app; the browser
    /// fills it, submits, reads the result, takes a screenshot of the window's size, and leaves
    /// no chromedriver or Chromium behind when dropped.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drives_a_page_and_leaves_no_process_behind() {
        use axum::Router;
        use axum::response::Html;
        use axum::routing::get;

        let app = Router::new()
            .route(
                "/",
                get(|| async {
                    Html(
                        "<html><body><form id=f action=/hello method=get>\
                         <input id=name name=name><button id=go type=submit>Go</button>\
                         </form></body></html>",
                    )
                }),
            )
            .route(
                "/hello",
                get(
                    |axum::extract::RawQuery(q): axum::extract::RawQuery| async move {
                        let name = q.unwrap_or_default().replace("name=", "");
                        Html(format!(
                            "<html><body><p id=out>hello {name}</p></body></html>"
                        ))
                    },
                ),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });

        let browser = Browser::start().await.unwrap_or_else(|e| panic!("{e:#}"));
        let group = browser.driver.child.id();
        browser.goto(&format!("http://{addr}/")).await.unwrap();
        browser.fill("#name", "plant").await.unwrap();
        browser.click("#go").await.unwrap();
        let out = browser
            .wait_for_text("#out", "a greeting", false, WAIT_DEADLINE, |t| {
                t.starts_with("hello")
            })
            .await
            .unwrap();
        assert_eq!(out, "hello plant");
        let missing = browser.wait_for_text("#nothing", "nothing", false, Duration::ZERO, |_| true);
        let err = format!("{:#}", missing.await.unwrap_err());
        assert!(err.contains("hello plant"), "shows the page: {err}");

        let dir = tempfile::tempdir().unwrap();
        let shot = dir.path().join("shots/page.png");
        browser.screenshot(&shot).await.unwrap();
        let png = std::fs::read(&shot).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
        let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
        assert_eq!((width, height), WINDOW);

        // Dropped without close(), as on a failed assertion: the group is gone (killed processes
        // may linger a moment as zombies until their parent reaps them).
        assert!(!group_members(group).is_empty(), "the group is alive");
        drop(browser);
        let until = std::time::Instant::now() + WAIT_DEADLINE;
        while !group_members(group).is_empty() {
            assert!(
                std::time::Instant::now() < until,
                "processes of the browser's group are left: {:?}",
                group_members(group)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The live (not zombie) processes in process group `pgid`, as "pid command".
    fn group_members(pgid: u32) -> Vec<String> {
        let mut members = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after its ')'.
            let Some((head, rest)) = stat.rsplit_once(") ") else {
                continue;
            };
            let fields: Vec<&str> = rest.split(' ').collect();
            if fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string() {
                members.push(head.replace(" (", " "));
            }
        }
        members
    }
}
