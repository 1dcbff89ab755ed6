//! The end-to-end tests against the real servers that deploy/local/test starts: one test binary
//! with a module per area (each was a binary of its own; one binary compiles and links the
//! workspace's libraries and their generics once instead of thirteen times). deploy/local/test
//! runs the modules one after another, each with the parallelism a binary of its own had, so a
//! test shares the machine only with tests of its own area; `cargo test --test e2e -- nginx::`
//! runs one area.

mod browser;
mod clicks;
mod cluster;
mod deciders;
mod floods;
mod hangs;
mod kafka_tls;
mod lastresort;
mod nginx;
mod primary;
mod replication;
mod security;
mod traces;
