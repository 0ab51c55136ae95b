//! Partition balancer (pure). See SPEC "Cluster contract".
