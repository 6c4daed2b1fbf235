"""The floor every package stands on: settings (one definition each), the error vocabulary, output safety and
atomic writing, the process's signals and disks, the Ray session and the state folder. It imports no package
of the project."""
