/* placeholder: to be written */
