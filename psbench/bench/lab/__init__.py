"""The host lab: network namespaces as hosts, cluster files, the bandwidth experiment."""
