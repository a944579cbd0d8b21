# Cron tasks.
