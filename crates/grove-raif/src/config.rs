//! The TOML configuration (see below).
