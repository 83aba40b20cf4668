//! nodeward-coordinator: decides which nodes may be disrupted now, under cluster-wide limits
//! (leader election, admission, cluster health, pause). So far: the pure admission pieces
//! (budget math, maintenance windows); the controller and binary arrive with the coordinator
//! issue.

pub mod admission;
