//! End-to-end tests on real nodes: the node lab's VMs (systemd as PID 1, containerd, a real
//! kubelet) joined to the shared control plane. `./tests/run` gives the lab a control plane of
//! its own and runs these tests beside the others; run alone, the first test starts a lab
//! (minutes under software emulation).

mod bench;
mod chart;
mod cloud;
mod fencing;
mod halt;
mod host;
mod host_steps;
mod kernel;
mod kubelet;
mod network;
mod patching;
mod reboot;
mod recorders;
mod registration;
mod release;
mod rolling;
mod runtime;
mod shutdown;
mod stories;
mod support;
mod turns;
