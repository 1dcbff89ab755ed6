//! The probes' shared code: [`dns`], the A-record lookup the DNS probe and the rung-4 drill use.

pub mod dns;
