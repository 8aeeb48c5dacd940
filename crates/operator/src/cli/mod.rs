pub mod crd;
pub mod manifests;
pub mod render;
pub mod render_gateway;
pub mod run;
