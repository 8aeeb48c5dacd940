pub mod crd;
pub mod manifests;
pub mod render;
pub mod render_gateway;
pub mod render_output;
pub mod run;
