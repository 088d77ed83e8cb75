//! The fencelock client (being written).
