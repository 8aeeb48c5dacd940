//! Renderers (in progress).
