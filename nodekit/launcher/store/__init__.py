"""The preflight store on main's preflight port: the key-value core, the server, the client and the handshake that
admits only the job."""
