//! The two nodes of an in-process pair: "a", configured active, and "b", its standby, with
//! their buffer files in one temporary directory. Each node's pair-link port is held from the
//! start and held again as soon as the node stops, so nothing running beside the test can take
//! it before the node comes back.

use std::path::{Path, PathBuf};

use super::*;
use crate::domain::Role;

/// One node of the pair.
#[derive(Debug, Clone, Copy)]
pub(super) enum Node {
    A,
    B,
}

impl Node {
    fn index(self) -> usize {
        self as usize
    }

    fn peer(self) -> Self {
        match self {
            Self::A => Self::B,
            Self::B => Self::A,
        }
    }
}

pub(super) struct PairRig {
    central: SocketAddr,
    _dir: tempfile::TempDir,
    buffers: [PathBuf; 2],
    addrs: [SocketAddr; 2],
    /// The port of each node that is not running, held for its start.
    held: [Option<Reserved>; 2],
}

impl PairRig {
    /// A pair forwarding to `central` (served by the test or only reserved), neither node
    /// running yet.
    pub(super) fn new(central: SocketAddr) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (Reserved::new(), Reserved::new());
        Self {
            central,
            buffers: [dir.path().join("a.db"), dir.path().join("b.db")],
            _dir: dir,
            addrs: [a.addr, b.addr],
            held: [Some(a), Some(b)],
        }
    }

    /// The node's buffer file, to read beside it.
    pub(super) fn buffer(&self, node: Node) -> &Path {
        &self.buffers[node.index()]
    }

    /// Both buffer files, "a" then "b", owned (to read beside a node the test moves).
    pub(super) fn buffers(&self) -> (PathBuf, PathBuf) {
        (self.buffers[0].clone(), self.buffers[1].clone())
    }

    /// Starts `node` (in its configured role) and returns once it serves.
    pub(super) async fn start(&mut self, node: Node) -> Site {
        let port = self.held[node.index()]
            .take()
            .expect("a node is started once until it stops");
        let (name, role) = match node {
            Node::A => ("a", Role::Active),
            Node::B => ("b", Role::Standby),
        };
        let configure = pair_node(
            name,
            role,
            self.addrs[node.index()],
            self.addrs[node.peer().index()],
            self.buffers[node.index()].clone(),
        );
        start_pair_node(self.central, port, configure).await
    }

    /// Shuts `node` down cleanly and holds its port for a later [`PairRig::start`].
    pub(super) async fn stop(&mut self, node: Node, site: Site) {
        site.shut_down().await;
        self.held[node.index()] = Some(Reserved::again(self.addrs[node.index()]));
    }
}
