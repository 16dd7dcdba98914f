"""`make bench`: NodeImage against the plain `docker save | ssh | docker load`, measured in the same run."""
