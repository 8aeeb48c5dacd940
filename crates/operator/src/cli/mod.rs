pub mod crd;
pub mod manifests;
pub mod render;
pub mod run;
