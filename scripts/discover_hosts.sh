#!/bin/sh
# Host discovery for Horovod Elastic (horovodrun --host-discovery-script):
# prints the hosts that may run workers, one "hostname:slots" per line, from
# the file named by $ELASTIC_HOSTS (default: elastic_hosts.txt in the
# directory horovodrun runs in). Edit the file while the job runs: horovodrun
# reads it every second, starts workers on added hosts and stops those on
# removed ones.
#
# On one machine, list two names of it, so that losing a worker does not
# lose the machine (Horovod blacklists a failed worker's host name):
#   printf 'localhost:1\n127.0.0.1:1\n' > elastic_hosts.txt
exec cat "${ELASTIC_HOSTS:-elastic_hosts.txt}"
