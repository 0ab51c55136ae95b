//! Lease election state machine (pure). See SPEC "Cluster contract".
