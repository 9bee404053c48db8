//! A TCP link with a fixed one-way delay, to see how a protocol fares on a wire that is not
//! loopback: everything sent to [`DelayLink::addr`] is relayed to the upstream address, and
//! every chunk the relay reads, in either direction, is written out `one_way` after it was
//! read. A request and its reply therefore cost one round trip, `2 × one_way`.
//!
//! Invariants:
//! - Order is kept: each direction is one queue of `(deliver_at, bytes)`, drained in order by
//!   a writer that sleeps until each chunk's own `deliver_at` (never for a fixed time per
//!   chunk), so chunks in flight overlap in time as on a real link and the delay does not
//!   limit throughput. Only the queue's bound ([`QUEUED_CHUNKS`]) does, far above what the
//!   tests and the bench send.
//! - A half-close travels like data: the end of one direction is delivered `one_way` after the
//!   relay saw it, after every byte before it; an error on either side cuts the whole
//!   connection, as a broken path would.
//! - The TCP handshake itself is not delayed (the relay accepts at once and dials upstream at
//!   once), so opening a connection costs nothing here; the greeting a server sends first
//!   still takes `one_way`.
//! - Nothing a peer sends can panic the relay: a failing socket ends its own connection.
//!
//! # Waits
//!
//! [`DelayLink::client_turns`] counts the client's *turns*: a turn starts when the client →
//! server direction has data to deliver and, since the client's previous data, the server →
//! client direction has delivered something (or the client has sent nothing yet on this
//! connection). In other words, each time the client speaks after having heard from the
//! server. A client that must wait for a reply before it can go on (a plain SMTP client after
//! MAIL, each RCPT, DATA and the message) takes one turn per reply it waits for; a pipelining
//! client that sends MAIL, every RCPT and DATA together takes one turn for all of them. So turns
//! divided by the messages delivered is the *waits per message* as seen at the relay, and each
//! wait costs at least one round trip: with `c` connections, `w` waits per message and a round
//! trip of `rtt`, delivery cannot exceed `c / (w × rtt)` messages a second.
//!
//! "Delivered" is the moment the relay starts writing a chunk to the client, marked just
//! before the write so a client that answers at once can never be seen answering first. The
//! count can err only when both sides send at the same time, which a request/reply protocol
//! does not do (a server's unsolicited reply while the client is still sending would count the
//! client's next chunk as a new turn).
//!
//! For looking at what the turns are, [`LinkOptions::record_turns`] keeps the first bytes of
//! each of the first turns of every connection ([`DelayLink::transcripts`]).
//!
//! # Why threads, not tokio timers
//!
//! tokio's timer works in whole milliseconds: a sleep of 0.5 ms ends on the next millisecond
//! tick or later, which would make a "1 ms" round trip anything from 1 to 3 ms. So each
//! direction of each connection is a reader thread and a writer thread on blocking sockets, and
//! the writer sleeps with `std::thread::sleep` (nanosleep, usually within ~0.1 ms of the
//! deadline). How late chunks were actually delivered is measured
//! ([`DelayLink::lateness`]), so a figure can say what round trip it really had. Only the
//! listener runs on tokio (the relay is started from async code); four threads per connection
//! are fine for the handful of pooled connections it is made for.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Bytes asked for per read. Anything the peer has sent up to this much is one chunk.
const READ_CHUNK: usize = 64 * 1024;
/// Chunks queued per direction before the reader stops reading (and so TCP pushes back on the
/// sender). 256 reads of up to 64 KiB is 16 MiB in flight: at a one-way delay of 5 ms that is
/// over 3 GB/s, so the bound never shapes a figure, yet a stalled receiver cannot make the
/// relay buffer without limit.
const QUEUED_CHUNKS: usize = 256;
/// Connections whose turns are recorded when recording is on: enough for a pool and its
/// replacements, bounded so a long run cannot grow the transcripts without limit.
const RECORDED_CONNECTIONS: usize = 64;
/// Bytes kept of each recorded turn: a few command lines, or the start of a message.
const RECORDED_TURN_BYTES: usize = 256;
/// Pause after a failed accept (e.g. out of file descriptors) so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// How a link is set up.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkOptions {
    /// Delay added to every chunk in each direction; a round trip costs twice this.
    pub one_way: Duration,
    /// Keep the first bytes of the first this-many client turns of each connection (0: none).
    pub record_turns: usize,
}

/// How late chunks were delivered, beyond the fixed delay (sleeping is never exact).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Lateness {
    /// Chunks delivered, both directions.
    pub chunks: u64,
    pub mean: Duration,
    pub max: Duration,
}

/// A running relay; stops (cutting every open connection) when dropped.
#[derive(Debug)]
pub struct DelayLink {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

#[derive(Debug)]
struct Shared {
    options: LinkOptions,
    /// Set once by [`DelayLink::stop`]; writers drop what is still queued instead of
    /// delivering it.
    stopped: AtomicBool,
    connections: AtomicU64,
    client_turns: AtomicU64,
    /// Chunks delivered, and the sum and maximum of their lateness in nanoseconds.
    delivered: AtomicU64,
    late_total_ns: AtomicU64,
    late_max_ns: AtomicU64,
    /// Both sockets of every open connection, by connection number, so a stop can cut them
    /// (a blocking read only returns once its socket is shut down).
    open: Mutex<HashMap<u64, [std::net::TcpStream; 2]>>,
    /// The recorded turns: per connection (in accept order), per turn, its first bytes.
    transcripts: Mutex<Vec<Vec<Vec<u8>>>>,
}

impl DelayLink {
    /// Relays from a new loopback port to `upstream`, adding `one_way` in each direction.
    pub async fn start(upstream: SocketAddr, one_way: Duration) -> io::Result<DelayLink> {
        Self::start_with(
            upstream,
            LinkOptions {
                one_way,
                record_turns: 0,
            },
        )
        .await
    }

    /// [`DelayLink::start`] with every option.
    pub async fn start_with(upstream: SocketAddr, options: LinkOptions) -> io::Result<DelayLink> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            options,
            stopped: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            client_turns: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            late_total_ns: AtomicU64::new(0),
            late_max_ns: AtomicU64::new(0),
            open: Mutex::new(HashMap::new()),
            transcripts: Mutex::new(Vec::new()),
        });
        let accept = tokio::spawn(accept_loop(listener, upstream, Arc::clone(&shared)));
        Ok(DelayLink {
            addr,
            shared,
            accept,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn one_way(&self) -> Duration {
        self.shared.options.one_way
    }

    /// What a request and its reply cost on this link: twice the one-way delay.
    pub fn round_trip(&self) -> Duration {
        self.shared.options.one_way * 2
    }

    /// Connections relayed so far (those upstream refused are not counted).
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Client turns so far, over every connection (see the module's "Waits").
    pub fn client_turns(&self) -> u64 {
        self.shared.client_turns.load(Ordering::Relaxed)
    }

    /// How late chunks were delivered beyond `one_way`, so far.
    pub fn lateness(&self) -> Lateness {
        let chunks = self.shared.delivered.load(Ordering::Relaxed);
        let total = self.shared.late_total_ns.load(Ordering::Relaxed);
        Lateness {
            chunks,
            mean: Duration::from_nanos(total.checked_div(chunks).unwrap_or(0)),
            max: Duration::from_nanos(self.shared.late_max_ns.load(Ordering::Relaxed)),
        }
    }

    /// The recorded turns (with [`LinkOptions::record_turns`]): per connection in accept order,
    /// the first bytes of each of its first turns, as text (invalid UTF-8 replaced).
    pub fn transcripts(&self) -> Vec<Vec<String>> {
        self.shared
            .transcripts()
            .iter()
            .map(|turns| {
                turns
                    .iter()
                    .map(|t| String::from_utf8_lossy(t).into_owned())
                    .collect()
            })
            .collect()
    }

    /// Stops accepting and cuts every open connection; what is still queued is dropped.
    pub fn stop(&self) {
        self.shared.stopped.store(true, Ordering::Release);
        self.accept.abort();
        let open = std::mem::take(&mut *self.shared.open());
        for sockets in open.values() {
            cut(sockets);
        }
    }
}

impl Drop for DelayLink {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    fn open(&self) -> MutexGuard<'_, HashMap<u64, [std::net::TcpStream; 2]>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn transcripts(&self) -> MutexGuard<'_, Vec<Vec<Vec<u8>>>> {
        self.transcripts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn note_lateness(&self, late: Duration) {
        let ns = u64::try_from(late.as_nanos()).unwrap_or(u64::MAX);
        self.delivered.fetch_add(1, Ordering::Relaxed);
        self.late_total_ns.fetch_add(ns, Ordering::Relaxed);
        self.late_max_ns.fetch_max(ns, Ordering::Relaxed);
    }
}

/// Runs until the link is stopped (the task is aborted) or its runtime ends.
async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(_) => {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            // Upstream refusing closes the client's connection: what a dead relay looks like.
            let Ok(server) = TcpStream::connect(upstream).await else {
                return;
            };
            // Nothing to report to: a relay that cannot start threads drops the connection,
            // which the client sees as a failed connection.
            let _ = relay(shared, client, server);
        });
    }
}

/// Which way a chunk travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ClientToServer,
    ServerToClient,
}

/// What a reader hands its writer.
enum Chunk {
    Data {
        at: Instant,
        bytes: Vec<u8>,
    },
    /// The sender half-closed: shut down writing on the other side at `at`.
    End {
        at: Instant,
    },
}

/// One relayed connection's state shared by its four threads.
struct Connection {
    id: u64,
    shared: Arc<Shared>,
    client: std::net::TcpStream,
    server: std::net::TcpStream,
    /// Set by the server → client writer just before it writes; taken by the client → server
    /// reader to decide whether the client's next chunk starts a turn.
    server_spoke: AtomicBool,
    /// Index into the transcripts, when this connection's turns are recorded.
    transcript: Option<usize>,
    /// Writers still running; the last one out closes the connection.
    writers: AtomicUsize,
}

impl Connection {
    /// Shuts down both sockets, which ends every thread of this connection.
    fn cut(&self) {
        cut([&self.client, &self.server]);
    }

    fn writer_done(&self) {
        if self.writers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.cut();
            self.shared.open().remove(&self.id);
        }
    }
}

fn cut<'a>(sockets: impl IntoIterator<Item = &'a std::net::TcpStream>) {
    for socket in sockets {
        // Already closed is fine: the point is that nothing stays blocked on it.
        let _ = socket.shutdown(Shutdown::Both);
    }
}

/// Starts the four threads of one connection.
fn relay(shared: Arc<Shared>, client: TcpStream, server: TcpStream) -> io::Result<()> {
    let client = blocking(client)?;
    let server = blocking(server)?;
    let id = shared.connections.fetch_add(1, Ordering::Relaxed);
    let transcript = if shared.options.record_turns > 0 {
        let mut transcripts = shared.transcripts();
        (transcripts.len() < RECORDED_CONNECTIONS).then(|| {
            transcripts.push(Vec::new());
            transcripts.len() - 1
        })
    } else {
        None
    };
    shared
        .open()
        .insert(id, [client.try_clone()?, server.try_clone()?]);
    let connection = Arc::new(Connection {
        id,
        shared: Arc::clone(&shared),
        client: client.try_clone()?,
        server: server.try_clone()?,
        server_spoke: AtomicBool::new(false),
        transcript,
        writers: AtomicUsize::new(2),
    });
    let (c2s_tx, c2s_rx) = sync_channel(QUEUED_CHUNKS);
    let (s2c_tx, s2c_rx) = sync_channel(QUEUED_CHUNKS);
    let started = (|| -> io::Result<()> {
        spawn("delay-link-c2s-write", {
            let (connection, to) = (Arc::clone(&connection), server.try_clone()?);
            move || write_side(&connection, Direction::ClientToServer, to, c2s_rx)
        })?;
        spawn("delay-link-s2c-write", {
            let (connection, to) = (Arc::clone(&connection), client.try_clone()?);
            move || write_side(&connection, Direction::ServerToClient, to, s2c_rx)
        })?;
        spawn("delay-link-c2s-read", {
            let connection = Arc::clone(&connection);
            move || read_side(&connection, Direction::ClientToServer, client, c2s_tx)
        })?;
        spawn("delay-link-s2c-read", {
            let connection = Arc::clone(&connection);
            move || read_side(&connection, Direction::ServerToClient, server, s2c_tx)
        })
    })();
    if started.is_err() {
        connection.cut();
        shared.open().remove(&id);
    }
    started
}

fn blocking(stream: TcpStream) -> io::Result<std::net::TcpStream> {
    let stream = stream.into_std()?;
    stream.set_nonblocking(false)?;
    // Each chunk goes out when its time comes, as the peer wrote it; Nagle would hold small
    // replies back for an ACK and add delay the link was not asked for.
    stream.set_nodelay(true)?;
    Ok(stream)
}

fn spawn(name: &str, body: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new()
        .name(name.to_string())
        .spawn(body)
        .map(drop)
}

/// Reads chunks from `from` and queues each with its delivery time, until the end of the
/// stream or an error (which cuts the connection).
fn read_side(
    connection: &Connection,
    direction: Direction,
    mut from: std::net::TcpStream,
    queue: SyncSender<Chunk>,
) {
    let one_way = connection.shared.options.one_way;
    let mut buf = vec![0u8; READ_CHUNK];
    let mut turns = TurnCounter::default();
    loop {
        let n = match from.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                connection.cut();
                return;
            }
        };
        let at = Instant::now() + one_way;
        if n == 0 {
            // The writer may be gone already (its side failed); nothing left to tell it.
            let _ = queue.send(Chunk::End { at });
            return;
        }
        let bytes = buf.get(..n).unwrap_or_default().to_vec();
        if direction == Direction::ClientToServer {
            turns.client_chunk(connection, &bytes);
        }
        if queue.send(Chunk::Data { at, bytes }).is_err() {
            // The writer failed and cut the connection.
            return;
        }
    }
}

/// Delivers queued chunks at their times, in order, until the reader ends or a write fails.
fn write_side(
    connection: &Connection,
    direction: Direction,
    mut to: std::net::TcpStream,
    queue: Receiver<Chunk>,
) {
    let shared = &connection.shared;
    for chunk in queue {
        let at = match &chunk {
            Chunk::Data { at, .. } | Chunk::End { at } => *at,
        };
        // Sleeping until the chunk's own time, not for `one_way`, is what lets chunks in
        // flight overlap: a chunk read while an earlier one waits is not delayed further.
        let now = Instant::now();
        if at > now {
            std::thread::sleep(at - now);
        }
        if shared.stopped.load(Ordering::Acquire) {
            break;
        }
        shared.note_lateness(Instant::now().saturating_duration_since(at));
        let written = match chunk {
            Chunk::Data { bytes, .. } => {
                if direction == Direction::ServerToClient {
                    connection.server_spoke.store(true, Ordering::Release);
                }
                to.write_all(&bytes)
            }
            Chunk::End { .. } => {
                // The sender is done; the other direction may still carry replies.
                let _ = to.shutdown(Shutdown::Write);
                break;
            }
        };
        if written.is_err() {
            connection.cut();
            break;
        }
    }
    connection.writer_done();
}

/// The client → server reader's view of turns (see the module's "Waits").
#[derive(Default)]
struct TurnCounter {
    /// Whether the client has sent anything yet on this connection.
    started: bool,
    /// Whether the turn under way is being recorded (its first bytes are kept).
    recording: bool,
}

impl TurnCounter {
    fn client_chunk(&mut self, connection: &Connection, bytes: &[u8]) {
        let heard = connection.server_spoke.swap(false, Ordering::AcqRel);
        let new_turn = heard || !self.started;
        self.started = true;
        if new_turn {
            connection
                .shared
                .client_turns
                .fetch_add(1, Ordering::Relaxed);
        }
        let Some(index) = connection.transcript else {
            return;
        };
        let mut transcripts = connection.shared.transcripts();
        let Some(turns) = transcripts.get_mut(index) else {
            return;
        };
        if new_turn {
            self.recording = turns.len() < connection.shared.options.record_turns;
            if self.recording {
                turns.push(Vec::new());
            }
        }
        if self.recording
            && let Some(turn) = turns.last_mut()
        {
            let room = RECORDED_TURN_BYTES.saturating_sub(turn.len());
            turn.extend_from_slice(&bytes[..room.min(bytes.len())]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

    /// An upstream that echoes every byte back, closing when the client half-closes.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = socket.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    /// An upstream that greets with "hi" and answers every line with "ok", as a line-based
    /// request/reply server (SMTP without the codes) does.
    async fn line_server() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (r, mut w) = socket.into_split();
                    let mut lines = BufReader::new(r).lines();
                    if w.write_all(b"hi\n").await.is_err() {
                        return;
                    }
                    while let Ok(Some(_)) = lines.next_line().await {
                        if w.write_all(b"ok\n").await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn a_round_trip_costs_twice_the_one_way_delay() {
        let one_way = Duration::from_millis(25);
        let link = DelayLink::start(echo_server().await, one_way)
            .await
            .unwrap();
        assert_eq!(link.round_trip(), Duration::from_millis(50));
        let mut client = TcpStream::connect(link.addr()).await.unwrap();
        for _ in 0..3 {
            let started = Instant::now();
            client.write_all(b"ping").await.unwrap();
            let mut reply = [0u8; 4];
            client.read_exact(&mut reply).await.unwrap();
            let took = started.elapsed();
            assert_eq!(&reply, b"ping");
            // Never sooner than the round trip; the upper bound only catches a delay applied
            // twice over, generously, for a busy machine.
            assert!(took >= link.round_trip(), "{took:?}");
            assert!(took < Duration::from_secs(2), "{took:?}");
        }
        let lateness = link.lateness();
        assert_eq!(lateness.chunks, 6);
        assert!(lateness.max >= lateness.mean);
    }

    #[tokio::test]
    async fn bytes_arrive_in_order_and_chunks_in_flight_overlap() {
        let one_way = Duration::from_millis(50);
        let link = DelayLink::start(echo_server().await, one_way)
            .await
            .unwrap();
        let client = TcpStream::connect(link.addr()).await.unwrap();
        let (mut r, mut w) = client.into_split();
        // 40 writes 5 ms apart, so the relay reads them as separate chunks: delivered one
        // after another with a full delay each, they would take 40 × 100 ms = 4 s to come back.
        let chunks: Vec<Vec<u8>> = (0..40u8)
            .map(|i| {
                (0..1000)
                    .map(|j| i.wrapping_mul(7).wrapping_add(j as u8))
                    .collect()
            })
            .collect();
        let sent: Vec<u8> = chunks.concat();
        let started = Instant::now();
        let writer = tokio::spawn(async move {
            for chunk in chunks {
                w.write_all(&chunk).await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            w.shutdown().await.unwrap();
        });
        let mut received = Vec::new();
        r.read_to_end(&mut received).await.unwrap();
        let took = started.elapsed();
        writer.await.unwrap();
        assert_eq!(received.len(), sent.len());
        assert!(received == sent, "bytes reordered or changed");
        // About 40 × 5 ms of writing plus one round trip; 4 s if the delays added up.
        assert!(took < Duration::from_millis(2000), "{took:?}");
        assert!(took >= link.round_trip(), "{took:?}");
    }

    #[tokio::test]
    async fn each_reply_waited_for_is_one_client_turn() {
        let link = DelayLink::start_with(
            line_server().await,
            LinkOptions {
                one_way: Duration::from_millis(5),
                record_turns: 10,
            },
        )
        .await
        .unwrap();
        let client = TcpStream::connect(link.addr()).await.unwrap();
        let (r, mut w) = client.into_split();
        let mut replies = BufReader::new(r).lines();
        assert_eq!(replies.next_line().await.unwrap().as_deref(), Some("hi"));
        // Two requests each waited for, then three sent together (pipelined), then one more.
        for request in [&b"A\n"[..], b"B\n"] {
            w.write_all(request).await.unwrap();
            assert_eq!(replies.next_line().await.unwrap().as_deref(), Some("ok"));
        }
        w.write_all(b"C\nD\nE\n").await.unwrap();
        for _ in 0..3 {
            assert_eq!(replies.next_line().await.unwrap().as_deref(), Some("ok"));
        }
        w.write_all(b"F\n").await.unwrap();
        assert_eq!(replies.next_line().await.unwrap().as_deref(), Some("ok"));

        assert_eq!(link.connections(), 1);
        assert_eq!(link.client_turns(), 4);
        assert_eq!(
            link.transcripts(),
            vec![vec!["A\n", "B\n", "C\nD\nE\n", "F\n"]]
        );

        // A second connection's turns add up with the first's.
        let client = TcpStream::connect(link.addr()).await.unwrap();
        let (r, mut w) = client.into_split();
        let mut replies = BufReader::new(r).lines();
        assert_eq!(replies.next_line().await.unwrap().as_deref(), Some("hi"));
        w.write_all(b"G\n").await.unwrap();
        assert_eq!(replies.next_line().await.unwrap().as_deref(), Some("ok"));
        assert_eq!(link.connections(), 2);
        assert_eq!(link.client_turns(), 5);
        assert_eq!(link.transcripts().get(1), Some(&vec!["G\n".to_string()]));
    }

    #[tokio::test]
    async fn a_client_that_speaks_first_takes_a_turn() {
        let link = DelayLink::start(echo_server().await, Duration::from_millis(1))
            .await
            .unwrap();
        let mut client = TcpStream::connect(link.addr()).await.unwrap();
        client.write_all(b"x").await.unwrap();
        let mut reply = [0u8; 1];
        client.read_exact(&mut reply).await.unwrap();
        assert_eq!(link.client_turns(), 1);
    }

    #[tokio::test]
    async fn an_unreachable_upstream_closes_the_client() {
        // A port that was free a moment ago: nothing listens there.
        let upstream = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let link = DelayLink::start(upstream, Duration::from_millis(1))
            .await
            .unwrap();
        let mut client = TcpStream::connect(link.addr()).await.unwrap();
        let mut buf = Vec::new();
        // Closed (0 bytes) or reset, never data and never a hang.
        let read = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut buf))
            .await
            .unwrap();
        assert!(read.map(|n| n == 0).unwrap_or(true));
        assert_eq!(link.connections(), 0);
    }

    #[tokio::test]
    async fn stopping_cuts_open_connections() {
        let link = DelayLink::start(echo_server().await, Duration::from_millis(1))
            .await
            .unwrap();
        let mut client = TcpStream::connect(link.addr()).await.unwrap();
        client.write_all(b"x").await.unwrap();
        let mut reply = [0u8; 1];
        client.read_exact(&mut reply).await.unwrap();
        link.stop();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut buf))
            .await
            .unwrap();
        assert!(read.map(|n| n == 0).unwrap_or(true));
    }
}
