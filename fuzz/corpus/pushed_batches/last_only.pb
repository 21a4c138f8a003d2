
job-1