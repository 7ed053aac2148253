//! int16 Linear layers (being written).
