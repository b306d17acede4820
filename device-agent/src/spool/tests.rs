//! Spool tests.
