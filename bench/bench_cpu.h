/*
 * bench_cpu.h - the CPU line every benchmark prints in its header (issue
 * 14: figures move with the CPU, which changes between machines): "MODEL
 * NAME, family F model M, N logical CPUs" from /proc/cpuinfo, "?" for a
 * field it lacks.
 */
#ifndef ST_BENCH_CPU_H
#define ST_BENCH_CPU_H

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static inline void bench_cpu_model(char *buf, size_t n)
{
	char line[512], name[256] = "?", fam[32] = "?", mod[32] = "?";
	FILE *f = fopen("/proc/cpuinfo", "r");
	while (f && fgets(line, sizeof(line), f)) {
		char *colon = strchr(line, ':');
		if (!colon)
			continue;
		char *val = colon + 1 + (colon[1] == ' ');
		val[strcspn(val, "\n")] = 0;
		if (!strncmp(line, "model name", 10) && !strcmp(name, "?"))
			snprintf(name, sizeof(name), "%s", val);
		else if (!strncmp(line, "cpu family", 10) && !strcmp(fam, "?"))
			snprintf(fam, sizeof(fam), "%s", val);
		else if (!strncmp(line, "model\t", 6) && !strcmp(mod, "?"))
			snprintf(mod, sizeof(mod), "%s", val);
	}
	if (f)
		fclose(f);
	snprintf(buf, n, "%s, family %s model %s, %ld logical CPUs", name, fam, mod,
		 sysconf(_SC_NPROCESSORS_ONLN));
}

#endif
