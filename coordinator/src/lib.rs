//! nodeward-coordinator: decides which nodes may be disrupted now, under cluster-wide limits
//! (leader election, admission, cluster health, pause). The crate is a placeholder in the
//! workspace until the coordinator issue fills it; it has no binary yet.
