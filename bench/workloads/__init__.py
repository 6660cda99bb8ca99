"""The inference benchmark's workloads: the JSON files and the script that writes them."""
