"""services: the verifier (cloud) and the edge client (device), over a real WebSocket.

    wire       the messages, which are also the schema (msgpack)
    compute    where a model pass runs: emulated from a hardware profile, or real in a thread
    scheduler  the verifier's one device: batches the passes of concurrent sessions
    verifier/  python -m services.verifier: target (+ draft for co-located SD) behind /ws
    edge/      python -m services.edge: the draft, the HTTP run API, the four modes' clients
    traces     rounds.csv and requests.csv, written as rounds happen
    launch     start the services as child processes and drive runs (tests, benchmarks)
    processes  the one process starter and free_port, shared with the orchestrator's launchers

See services/README.md for the verifier-only interface.
"""
