//! Health, readiness and metrics HTTP.
