//! Admission: which pending maintenances may start now. Pure decisions over plain data; the
//! controller that feeds them from the API server arrives with the rest of the coordinator.

pub mod budget;
pub mod decide;
pub mod window;
