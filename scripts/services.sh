#!/usr/bin/env bash
# Start what the tests need on this machine when it is not already running:
# PostgreSQL on 127.0.0.1:5432, Redis on 127.0.0.1:6379, and Debian's Chromium for browser tests.
set -euo pipefail

pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }

if ! pg_up; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start
  for _ in $(seq 1 60); do pg_up && break; sleep 0.5; done
  pg_up || { echo "PostgreSQL did not start" >&2; exit 1; }
fi

if ! redis_up; then
  echo "starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 60); do redis_up && break; sleep 0.5; done
  redis_up || { echo "Redis did not start" >&2; exit 1; }
fi

if [ ! -x /usr/bin/chromium ]; then
  echo "installing Chromium (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
fi
echo "services ready: PostgreSQL, Redis, Chromium"
