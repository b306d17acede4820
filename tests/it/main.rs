//! Whole-system tests: one integration binary, real `cortex-hub`, `cortex-signal` and
//! `cortex` processes on loopback ports chosen at run time, temp homes, bounded waits.

mod cli_model;
mod cli_ux;
mod compaction;
mod cortex_cli;
mod device_exec;
mod device_loss;
mod durability;
mod full_disk;
mod hostile;
mod local_waits;
mod log_secrets;
mod log_waits;
mod mesh_e2e;
mod mesh_hub;
mod metrics;
mod model_client;
mod monitors;
mod notices;
mod one_line;
mod openapi;
mod packaging;
mod page;
mod people;
mod powerloss;
mod remote_waits;
mod runner;
mod signal_cli;
mod signal_load;
mod signal_route;
mod spool_collect;
mod torture;
mod typed;
mod wait_cursor;
mod waitpoints;
mod webdriver;
