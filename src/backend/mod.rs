//! Compute backends. Only the CPU backend exists so far; it is chosen for every translator.
pub mod cpu;
