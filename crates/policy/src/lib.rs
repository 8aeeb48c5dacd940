//! Headscale policy: HuJSON base parsing and rendering of the generated parts (in progress).
