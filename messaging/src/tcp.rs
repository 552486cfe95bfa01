//! tcp (next)
