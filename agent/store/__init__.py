"""The rendezvous store seam: the typed KeyValueStore interface every agent module uses
(kv.py), its implementation over torch's TCPStore with bounded calls (tcp.py), and
hosting or reaching a TCPStore (opening.py). A second backend (etcd) implements kv.py."""
