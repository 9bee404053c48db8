//! An in-process active/standby pair: the standby's copy, from the table and from memory, and
//! the rows central acked leaving it.

use super::*;

/// The notification ids in a buffer file's `buffered` table with their priority ranks.
fn buffered_priorities(buffer: &std::path::Path) -> std::collections::BTreeMap<String, i64> {
    read_buffer(
        buffer,
        "SELECT notification_id, priority FROM buffered",
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
}

/// Sends `n` notifications on 8 connections at once, cycling through every priority value
/// (unspecified included); returns their ids.
async fn send_concurrently(site: &Site, n: usize, tag: &str) -> Vec<String> {
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..8 {
        let mut client = site.client.clone();
        let tag = tag.to_owned();
        tasks.spawn(async move {
            let mut ids = Vec::new();
            for i in (caller..n).step_by(8) {
                let mut request = send_request(&format!("{tag} {i}"));
                request.priority = i32::try_from(i % 5).unwrap();
                let reply = client.send(request).await;
                ids.push(reply.unwrap().into_inner().notification_id);
            }
            ids
        });
    }
    let mut ids = Vec::new();
    while let Some(done) = tasks.join_next().await {
        ids.extend(done.unwrap());
    }
    ids
}

/// The standby ends up with exactly the active's rows whichever way they reached it: read
/// back from the table (sent before it attached, or while it was down) or handed over in
/// memory (sent while it follows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_copies_rows_from_the_table_and_from_memory_alike() {
    let central = Reserved::new();
    let mut pair = PairRig::new(central.addr);
    let active = pair.start(Node::A).await;

    let mut sent = send_concurrently(&active, 300, "before").await;
    let mut standby = pair.start(Node::B).await;
    standby
        .wait_for("the rows sent before it attached", |s| s.depth == 300)
        .await;
    sent.extend(send_concurrently(&active, 600, "while following").await);
    standby
        .wait_for("the rows sent while it follows", |s| s.depth == 900)
        .await;
    let expected: std::collections::BTreeSet<String> = sent.iter().cloned().collect();
    assert_eq!(buffered_ids(pair.buffer(Node::B)), expected);

    // Down and back: it resumes, reading what it missed from the table.
    pair.stop(Node::B, standby).await;
    sent.extend(send_concurrently(&active, 200, "while away").await);
    let mut standby = pair.start(Node::B).await;
    sent.extend(send_concurrently(&active, 200, "after").await);
    standby
        .wait_for("every row after the restart", |s| s.depth == 1300)
        .await;
    let expected: std::collections::BTreeSet<String> = sent.into_iter().collect();
    assert_eq!(buffered_ids(pair.buffer(Node::B)), expected);
    assert_eq!(buffered_ids(pair.buffer(Node::A)), expected);
    // Each row with the priority it was sent with (an unspecified one stored as normal).
    let priorities = buffered_priorities(pair.buffer(Node::B));
    assert_eq!(priorities, buffered_priorities(pair.buffer(Node::A)));
    let ranks: std::collections::BTreeSet<i64> = priorities.values().copied().collect();
    assert_eq!(ranks, (0..4).collect());
    standby.shut_down().await;
    active.shut_down().await;
}

/// Rows central acks leave the standby too, including those acked while they were still
/// held in memory for the stream: it never keeps a row the active deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_drops_every_row_central_acked() {
    let central = FakeCentral::default();
    let (central_addr, central_stop) = serve_central(central.clone()).await;
    let mut pair = PairRig::new(central_addr);
    let mut active = pair.start(Node::A).await;
    let mut standby = pair.start(Node::B).await;
    let b_buffer = pair.buffer(Node::B);
    standby
        .wait_for("the standby to follow", |s| s.active_node == "a")
        .await;

    let sent = send_concurrently(&active, 600, "acked").await;
    active
        .wait_for("the active to settle every ack", |s| s.depth == 0)
        .await;
    let stored = central.stored_ids();
    assert!(sent.iter().all(|id| stored.binary_search(id).is_ok()));
    // An empty standby proves nothing yet: it can be empty for a moment while rows the active
    // deleted are still on their way to it, their removal in a later batch. A row committed now
    // reaches it in a batch that carries, or follows one that carried, every removal committed
    // before (batches are applied in order): once the standby holds that row, it holds nothing
    // else. Held unacked at central, so that it stays.
    central.acks_held.send_replace(true);
    let last = active.send("last").await;
    eventually("the standby to copy the last row", || {
        buffered_ids(b_buffer).contains(&last)
    })
    .await;
    assert_eq!(buffered_ids(b_buffer), [last].into());
    central.acks_held.send_replace(false);
    standby
        .wait_for("the standby to drop the last row", |s| s.depth == 0)
        .await;
    assert!(buffered_ids(b_buffer).is_empty());
    standby.shut_down().await;
    active.shut_down().await;
    central_stop.cancel();
}
