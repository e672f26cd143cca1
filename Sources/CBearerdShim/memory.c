#define _GNU_SOURCE
#include <link.h>
#include <elf.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include "bearerd_sys.h"

/* Whether an object's dynamic section asks for text relocations (then its code pages were
   written at load time and must not be dropped). */
static int has_text_relocations(const struct dl_phdr_info *info) {
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_DYNAMIC) continue;
        const ElfW(Dyn) *d = (const ElfW(Dyn) *)(info->dlpi_addr + ph->p_vaddr);
        for (; d->d_tag != DT_NULL; d++) {
            if (d->d_tag == DT_TEXTREL) return 1;
            if (d->d_tag == DT_FLAGS && (d->d_un.d_val & DF_TEXTREL)) return 1;
        }
    }
    return 0;
}

static int release_object(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    long *released = data;
    if (info->dlpi_name && strncmp(info->dlpi_name, "linux-vdso", 10) == 0) return 0;
    if (has_text_relocations(info)) return 0;
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) return 1;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        /* Read-only code segments only: never a writable one (relocated data would be lost). */
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X) || (ph->p_flags & PF_W)) continue;
        uintptr_t start = (uintptr_t)(info->dlpi_addr + ph->p_vaddr);
        uintptr_t end = start + ph->p_memsz;
        start = (start + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
        end &= ~((uintptr_t)page - 1);
        if (end <= start) continue;
        if (madvise((void *)start, end - start, MADV_DONTNEED) == 0) *released += (long)(end - start);
    }
    return 0;
}

long bearerd_release_code_pages(void) {
    long released = 0;
    dl_iterate_phdr(release_object, &released);
    return released;
}
