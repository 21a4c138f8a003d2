
/etc/passwd