"""The throughput regression check: ratios measured side by side, against a saved baseline."""
