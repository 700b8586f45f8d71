"""A throwaway PostgreSQL server for tests: initdb in a temporary directory, a free localhost port,
password logins over TCP, stopped and removed afterwards. Uses the machine's PostgreSQL binaries
(initdb, pg_ctl); as root it runs them as the `postgres` system user, since initdb refuses root."""

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile

import psycopg

USER, PASSWORD = "postgres", "search-test"


class ServerError(RuntimeError):
    """The server could not be started; the message says which step failed and why."""


def binary(name: str) -> str | None:
    """A server binary: on PATH, or in Debian's versioned directory, which is not on PATH."""
    versioned = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                       key=lambda path: int(path.split("/")[4]))
    return shutil.which(name) or (versioned[-1] if versioned else None)


def run(command: list[str], step: str) -> None:
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    result = subprocess.run(as_postgres + [binary(command[0]), *command[1:]], capture_output=True,
                            text=True, timeout=120)
    if result.returncode:
        output = result.stderr.strip() or result.stdout.strip()
        raise ServerError(f"{step} failed ({' '.join(command)}): {output}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`with Server() as server:` starts it; server.url(database) is a URL for the superuser."""

    def __enter__(self) -> "Server":
        for tool in ("initdb", "pg_ctl"):
            if binary(tool) is None:
                raise ServerError(f"no {tool}, on PATH or in /usr/lib/postgresql: install "
                                  "PostgreSQL's server (Debian: apt-get install postgresql)")
        self.dir = tempfile.mkdtemp(prefix="search-postgres-")
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise ServerError("initdb refuses root, and there is no `postgres` user to run "
                                  "it as") from None
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
        self.data, self.port = os.path.join(self.dir, "data"), free_port()
        password_file = os.path.join(self.dir, "password")
        with open(password_file, "w") as f:
            f.write(PASSWORD)
        if os.geteuid() == 0:
            os.chown(password_file, owner.pw_uid, owner.pw_gid)
        run(["initdb", "-D", self.data, "-U", USER, "--pwfile", password_file,
             "--auth-local", "trust", "--auth-host", "scram-sha-256"], "initdb")
        # Durability off: the server lives as long as the tests, and its fsyncs would slow them.
        options = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off")
        log = os.path.join(self.dir, "server.log")
        try:
            run(["pg_ctl", "-D", self.data, "-o", options, "-l", log, "-w", "-t", "60", "start"],
                "pg_ctl start")
        except ServerError as e:
            tail = open(log).read()[-2000:] if os.path.exists(log) else ""
            self.remove()
            raise ServerError(f"{e}\n{tail}") from None
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}:{PASSWORD}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """Creates a database; returns its URL."""
        with psycopg.connect(host="127.0.0.1", port=self.port, user=USER, password=PASSWORD,
                             dbname="postgres", autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __exit__(self, *exc) -> None:
        # immediate: the workers' connections are the test's own, nothing to flush.
        run(["pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"], "pg_ctl stop")
        self.remove()
