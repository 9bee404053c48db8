//! The standby lag an active reports is true at the moment it is read: with its standby frozen
//! (SIGSTOP), every Send the active accepts counts in `standby_lag_rows` and the age of the
//! oldest keeps growing, whatever the replication window or the heartbeats do; once the standby
//! runs again and catches up, the lag is zero.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use outbox_proto::v1;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use tonic::transport::Channel;

use crate::harness::{
    Process, binary, channel, eventually, free_addr, send_request, wait_until_serving,
};

/// Long: the frozen standby must not count as gone (no promotion when it wakes, no stream
/// dropped by the active meanwhile); the lag must be right regardless.
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(60);
/// Sends while the standby is frozen: many more than the replication window's 8 batches carry
/// while the Sends arrive one by one.
const FROZEN_SENDS: u64 = 300;

/// Writes the configuration of pair node `name` (`peer` is where it reaches its peer's pair
/// endpoint) and starts it as a process.
pub(crate) async fn spawn_node(
    dir: &Path,
    name: &str,
    role: &str,
    (send, pair, peer): (SocketAddr, SocketAddr, SocketAddr),
    central: SocketAddr,
    failover_timeout: Duration,
) -> Process {
    let config: PathBuf = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "site_id = \"site-a\"\nlisten_addr = \"{send}\"\nbuffer_path = \"{}\"\n\
             central_url = \"http://{central}\"\nforward_retry_interval = \"100ms\"\n\
             connect_timeout = \"1s\"\nrequest_timeout = \"5s\"\n\
             [pair]\nnode_name = \"{name}\"\ninitial_role = \"{role}\"\nlisten = \"{pair}\"\n\
             peer_url = \"http://{peer}\"\nfailover_timeout = \"{}ms\"\n",
            dir.join(format!("{name}.db")).display(),
            failover_timeout.as_millis(),
        ),
    )
    .unwrap();
    let process = Process::spawn(
        &binary("site-forwarder"),
        &["serve", "--config", config.to_str().unwrap()],
    );
    wait_until_serving(send).await;
    process
}

pub(crate) async fn stats(client: &mut SiteNotifyClient<Channel>) -> v1::BufferStats {
    client
        .get_buffer_stats(v1::GetBufferStatsRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Sends `signal` (`STOP`, `CONT`) to the process.
fn signal(process: &Process, signal: &str) {
    let pid = process.0.id().expect("the standby is running");
    let status = std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}: {status}");
}

/// Resumes the frozen process even when the test fails, so it can be killed and reaped.
struct Frozen<'a>(&'a Process);

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        signal(self.0, "CONT");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_standby_frozen_the_lag_counts_every_unconfirmed_send_and_its_age_grows() {
    let dir = tempfile::tempdir().unwrap();
    // No central: the rows stay in the active's buffer; the lag does not depend on it.
    let central = free_addr().await;
    let (a_send, a_pair, b_send, b_pair) = (
        free_addr().await,
        free_addr().await,
        free_addr().await,
        free_addr().await,
    );
    let a = (a_send, a_pair, b_pair);
    let _a = spawn_node(dir.path(), "a", "active", a, central, FAILOVER_TIMEOUT).await;
    let b = (b_send, b_pair, a_pair);
    let b = spawn_node(dir.path(), "b", "standby", b, central, FAILOVER_TIMEOUT).await;
    let mut active = SiteNotifyClient::new(channel(a_send).await);

    for i in 0..20 {
        active
            .send(send_request(&format!("warm {i}"), "x"))
            .await
            .unwrap();
    }
    eventually("the standby follows and has every row", || {
        let mut active = active.clone();
        async move {
            let s = stats(&mut active).await;
            (s.peer_connected && s.standby_lag_rows == 0 && s.standby_lag_seconds == 0.0)
                .then_some(())
        }
    })
    .await;

    signal(&b, "STOP");
    let frozen = Frozen(&b);
    for i in 0..FROZEN_SENDS {
        active
            .send(send_request(&format!("frozen {i}"), "x"))
            .await
            .unwrap();
    }
    // Every Send accepted since the standby stopped confirming, no more, no fewer.
    let first = eventually(
        "the lag counts every Send the standby has not confirmed",
        || {
            let mut active = active.clone();
            async move {
                let s = stats(&mut active).await;
                (s.standby_lag_rows == FROZEN_SENDS).then_some(s)
            }
        },
    )
    .await;
    assert!(first.standby_lag_seconds > 0.0, "{first:?}");
    let first_age = first.standby_lag_seconds;
    // Read again later: the same rows, an older oldest.
    eventually("the lag's age grows while the standby is frozen", || {
        let mut active = active.clone();
        async move {
            let s = stats(&mut active).await;
            assert_eq!(s.standby_lag_rows, FROZEN_SENDS, "{s:?}");
            (s.standby_lag_seconds > first_age + 0.2).then_some(())
        }
    })
    .await;

    drop(frozen);
    eventually(
        "the lag returns to zero once the standby runs again",
        || {
            let mut active = active.clone();
            async move {
                let s = stats(&mut active).await;
                (s.standby_lag_rows == 0 && s.standby_lag_seconds == 0.0 && s.peer_connected)
                    .then_some(())
            }
        },
    )
    .await;
    let standby = stats(&mut SiteNotifyClient::new(channel(b_send).await)).await;
    assert_eq!(
        standby.role,
        i32::from(v1::NodeRole::Standby),
        "{standby:?}"
    );
    assert_eq!(
        standby.depth,
        20 + FROZEN_SENDS,
        "the standby holds every row"
    );
}
