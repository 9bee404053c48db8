//! Crashes at the worst moment: SIGKILL of a real central or site-forwarder process while
//! notifications stream between them. Every Send that returned an id must end up in central's
//! table exactly once.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use tokio::task::JoinSet;

use crate::harness::{
    CentralDatabase, Db, Process, Site, binary, database_url, eventually, free_addr, send_request,
    wait_until_serving, wait_until_stored,
};

/// Total notifications sent in each crash test.
const SENDS: usize = 3000;

fn write_central_config(dir: &Path, addr: SocketAddr) -> std::path::PathBuf {
    let path = dir.join("central.toml");
    let database = database_url(&dir.join("central.db"));
    std::fs::write(
        &path,
        format!("listen_addr = \"{addr}\"\ndatabase = \"{database}\"\n"),
    )
    .unwrap();
    path
}

fn start_central(config: &Path) -> Process {
    Process::spawn(
        &binary("central-outbox"),
        &["--config", config.to_str().unwrap()],
    )
}

/// Sends [`SENDS`] notifications from 16 callers, recording each id the site acknowledged.
/// Sends that fail (the site itself being killed) are simply not recorded: only acked Sends carry
/// a promise.
fn spawn_senders(site: SocketAddr, acked: Arc<Mutex<HashSet<String>>>) -> JoinSet<()> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = JoinSet::new();
    for _ in 0..16 {
        let acked = Arc::clone(&acked);
        let next = Arc::clone(&next);
        tasks.spawn(async move {
            let mut client: Option<SiteNotifyClient<tonic::transport::Channel>> = None;
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= SENDS {
                    return;
                }
                if client.is_none() {
                    client = tonic::transport::Channel::from_shared(format!("http://{site}"))
                        .unwrap()
                        .connect()
                        .await
                        .ok()
                        .map(SiteNotifyClient::new);
                }
                let Some(c) = client.as_mut() else { continue };
                match c
                    .send(send_request(&format!("alarm {i}"), "crash test"))
                    .await
                {
                    Ok(reply) => {
                        acked
                            .lock()
                            .unwrap()
                            .insert(reply.into_inner().notification_id);
                    }
                    Err(_) => client = None,
                }
            }
        });
    }
    tasks
}

fn assert_exactly_once(db: &Db, acked: &HashSet<String>) {
    let stored = db.strings("SELECT NotificationId FROM Notifications");
    let unique: HashSet<String> = stored.iter().cloned().collect();
    assert_eq!(
        unique.len(),
        stored.len(),
        "no notification is stored twice"
    );
    let missing: Vec<_> = acked.difference(&unique).take(5).collect();
    assert!(
        missing.is_empty(),
        "acked Sends missing from central: {missing:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn central_killed_mid_stream_loses_no_acked_send() {
    let dir = tempfile::tempdir().unwrap();
    // Shared by every central process of the test (on MS SQL, a scratch database).
    let _central_db = CentralDatabase::create(&dir.path().join("central.db")).await;
    let central_addr = free_addr().await;
    let config = write_central_config(dir.path(), central_addr);
    let central = start_central(&config);
    wait_until_serving(central_addr).await;
    let site = Site::start(dir.path(), central_addr).await;

    let acked = Arc::new(Mutex::new(HashSet::new()));
    let mut senders = spawn_senders(site.addr, Arc::clone(&acked));
    let db_path = dir.path().join("central.db");
    let db = Db::open(&db_path);
    eventually("central has stored some notifications", || {
        let n = db.count("SELECT COUNT(*) FROM Notifications");
        async move { (n >= 300).then_some(()) }
    })
    .await;
    central.kill9().await;

    // The site keeps accepting while central is gone.
    while senders.join_next().await.is_some() {}
    let central = start_central(&config);
    wait_until_serving(central_addr).await;
    eventually("the site buffer drains", || async {
        (site.depth().await == 0).then_some(())
    })
    .await;

    let acked = acked.lock().unwrap().clone();
    assert_eq!(acked.len(), SENDS, "the site acked every Send");
    let db = Db::open(&db_path);
    assert_exactly_once(&db, &acked);
    assert_eq!(db.count("SELECT COUNT(*) FROM Notifications"), SENDS as i64);
    site.stop().await;
    drop(central);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn site_killed_mid_stream_loses_no_acked_send() {
    let dir = tempfile::tempdir().unwrap();
    // Shared by every central process of the test (on MS SQL, a scratch database).
    let _central_db = CentralDatabase::create(&dir.path().join("central.db")).await;
    let central_addr = free_addr().await;
    let config = write_central_config(dir.path(), central_addr);
    let _central = start_central(&config);
    wait_until_serving(central_addr).await;

    let site_addr = free_addr().await;
    let buffer = dir.path().join("site.db");
    let site_args = [
        "serve",
        "--site-id",
        "site-a",
        "--listen",
        &site_addr.to_string(),
        "--buffer",
        buffer.to_str().unwrap(),
        "--central",
        &format!("http://{central_addr}"),
    ]
    .map(String::from);
    let site_args: Vec<&str> = site_args.iter().map(String::as_str).collect();
    let site = Process::spawn(&binary("site-forwarder"), &site_args);
    wait_until_serving(site_addr).await;

    let acked = Arc::new(Mutex::new(HashSet::new()));
    let mut senders = spawn_senders(site_addr, Arc::clone(&acked));
    let db_path = dir.path().join("central.db");
    let db = Db::open(&db_path);
    eventually("central has stored some notifications", || {
        let n = db.count("SELECT COUNT(*) FROM Notifications");
        async move { (n >= 300).then_some(()) }
    })
    .await;
    site.kill9().await;
    while senders.join_next().await.is_some() {}

    // The restarted forwarder finds its buffer and forwards what is left.
    let _site = Process::spawn(&binary("site-forwarder"), &site_args);
    wait_until_serving(site_addr).await;
    let acked = acked.lock().unwrap().clone();
    assert!(!acked.is_empty());
    let expected = acked.len();
    wait_until_stored(&db, &acked).await;
    assert_exactly_once(&db, &acked);
    // Sends in flight at the kill may have committed without their caller hearing back; they
    // are delivered too, so central may hold a few more rows than were acked, never fewer.
    assert!(db.count("SELECT COUNT(*) FROM Notifications") >= expected as i64);
}
