
job-1