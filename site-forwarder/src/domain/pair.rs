//! A site pair as plain data: a node's role, how one node describes itself to the other, and
//! the pair's figures at one moment. The buffer (which stores the role), the config (which names
//! the starting role), the pair's tasks, metrics and the gRPC edge all speak these types; only
//! the gRPC edge turns them into protos.

use serde::Deserialize;

/// A node's role in its pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Active,
    Standby,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Standby => "standby",
        }
    }

    pub fn from_db(text: &str) -> Option<Self> {
        match text {
            "active" => Some(Role::Active),
            "standby" => Some(Role::Standby),
            _ => None,
        }
    }
}

/// The role and term as the services see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoleState {
    pub role: Role,
    pub term: u64,
}

/// A node as its peer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub role: Role,
    pub term: u64,
    pub send_addr: String,
}

impl NodeView {
    /// Of two active nodes, whether `self` stays active: the higher term, or with equal terms
    /// (two nodes both configured active that never met) the lower name.
    pub fn outranks(&self, other: &NodeView) -> bool {
        (self.term, std::cmp::Reverse(&self.name)) > (other.term, std::cmp::Reverse(&other.name))
    }
}

/// The pair's figures at one moment, for `GetBufferStats`, health reports and `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct PairStatus {
    pub role: Role,
    pub term: u64,
    pub node_name: String,
    pub peer_connected: bool,
    pub standby_lag_rows: u64,
    pub standby_lag_seconds: f64,
    pub active_node: String,
    pub active_silent_seconds: f64,
}

/// Why a standby refuses a Send or an adoption: the node to send to instead, when it knows it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("this site-forwarder ({node}) is the standby of its pair and accepts no Sends; {}", self.whom())]
pub struct NotActive {
    pub node: String,
    /// The active this node last followed, as it described itself.
    pub active: Option<NodeView>,
    /// The configured peer, named while the active is not known yet.
    pub peer_url: Option<String>,
}

impl NotActive {
    fn whom(&self) -> String {
        match &self.active {
            Some(active) => format!(
                "send to the active node {} at {}",
                active.name, active.send_addr
            ),
            None => format!(
                "send to the active node (its peer at {}; not reached yet)",
                self.peer_url.as_deref().unwrap_or("(none configured)")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(name: &str, term: u64) -> NodeView {
        NodeView {
            name: name.into(),
            role: Role::Active,
            term,
            send_addr: String::new(),
        }
    }

    #[test]
    fn the_higher_term_outranks_then_the_lower_name() {
        assert!(view("b", 3).outranks(&view("a", 2)));
        assert!(!view("a", 2).outranks(&view("b", 3)));
        assert!(view("a", 2).outranks(&view("b", 2)));
        assert!(!view("b", 2).outranks(&view("a", 2)));
        assert!(!view("a", 2).outranks(&view("a", 2)), "never both ways");
    }

    #[test]
    fn a_standby_names_the_active_or_else_its_peer() {
        let known = NotActive {
            node: "b".into(),
            active: Some(NodeView {
                send_addr: "10.0.0.1:50051".into(),
                ..view("a", 2)
            }),
            peer_url: Some("http://10.0.0.1:50052".into()),
        };
        assert!(
            known
                .to_string()
                .ends_with("send to the active node a at 10.0.0.1:50051"),
            "{known}"
        );
        let unknown = NotActive {
            active: None,
            ..known
        };
        assert!(
            unknown
                .to_string()
                .contains("its peer at http://10.0.0.1:50052; not reached yet"),
            "{unknown}"
        );
    }
}
