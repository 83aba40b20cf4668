//! The agent against real parts, one module per concern: `check` and the detectors in real
//! network namespaces and against systemd and logind on private buses, its listeners under
//! siege, its reports and Events on the real control plane, and its maintenances with the
//! real coordinator. A test that runs a coordinator (which acts on the whole cluster) takes
//! its environment alone (`TestEnv::alone`); the others overlap.

mod check;
mod cloud_notices;
mod fencing;
mod kubelet;
mod listeners;
mod maintenance;
mod peers;
mod report;
mod rolling_reboot;
mod security_groups;
mod shutdown;
