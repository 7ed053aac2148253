//! int8 Linear layers (being written).
