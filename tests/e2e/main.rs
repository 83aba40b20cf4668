//! End-to-end tests against the real control plane (see `tests/controlplane/`).

mod cordon;
mod docs;
mod identity;
mod images;
mod packaging;
mod release;
mod smoke;
mod writes;
