"""Operations: systemd notifications, metrics, logging."""
