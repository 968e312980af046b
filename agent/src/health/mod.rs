//! Node health checks (issue 6).
