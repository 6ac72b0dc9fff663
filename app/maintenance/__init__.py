"""Background services: lease rescue, retention, vacuum, statistics, gauges."""
