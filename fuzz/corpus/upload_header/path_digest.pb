

m../../../../etc/passwd